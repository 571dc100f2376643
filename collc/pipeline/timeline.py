"""The timeline of one pipeline-parallel step.

Each pipeline rank has one compute stream and runs its actions in the schedule's
order; an action starts when the previous one on its rank has finished and its inputs
have arrived: a forward needs the previous stage's activations, a backward (B or I)
its own forward and the next stage's input gradient, a W its own I. Activations and
gradients travel between ranks on their own streams (they never delay compute they do
not feed); their times come from collc's alpha-beta model (network.py). After its last
action, each rank's data-parallel replicas combine gradients with one collective; the
step ends when the last of those ends.

A timeline is NumPy columns, one per field of its events (`EventColumns`), worked out
by one of two engines that give the same floats, operation for operation:

- the wavefront (`_run_by_wavefront`): the actions form a graph (each waits on the
  previous action of its rank and on at most two inputs); every round runs, as array
  operations, all the actions whose predecessors have all run. A 1,000-stage,
  1,000-micro-batch 1F1B step, two million actions, runs in about 4,000 rounds of 500.
- the event loop (`_run_by_loop`): a worklist over ranks: a rank runs actions until
  one waits on an input not yet produced, and is woken when that input is produced, so
  each action is visited a constant number of times. It is the reference, and it runs
  what the wavefront does not: pipelines whose rounds would be narrow (few ranks, or
  thousands of stages with a few micro-batches: a round costs tens of microseconds
  whatever its width), and orders that repeat an action or deadlock (its errors name
  the action at fault).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Sequence

import numpy as np

from collc.diagnostics import CollcError, Span
from collc.ir.heap import few_collections
from collc.pipeline.schedules import (
    B_CODE, F_CODE, I_CODE, KIND_CODES, W_CODE, Action, ActionColumns, ScheduleOrder,
)


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


# Events are not frozen: a frozen dataclass's __init__ goes through object.__setattr__.
# They are views of a timeline's columns, made for a few events at a time.
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


@dataclass(frozen=True, eq=False)
class EventColumns:
    """Compute events rank after rank (rank r's are [offsets[r], offsets[r + 1])), one
    array per field. The input that arrived last is (input_stage, input_kind,
    input_microbatch), its kind -1 where there is none."""

    offsets: np.ndarray
    stage: np.ndarray
    kind: np.ndarray  # code: index in KIND_CODES
    microbatch: np.ndarray
    start: np.ndarray
    end: np.ndarray
    input_stage: np.ndarray
    input_kind: np.ndarray
    input_microbatch: np.ndarray
    input_ready: np.ndarray
    input_produced: np.ndarray

    def __len__(self) -> int:
        return int(self.start.size)

    @cached_property
    def rank(self) -> np.ndarray:
        return np.repeat(np.arange(self.offsets.size - 1, dtype=np.int64), np.diff(self.offsets))

    @property
    def actions(self) -> ActionColumns:
        return ActionColumns(self.offsets, self.stage, self.kind, self.microbatch)

    def event(self, i: int) -> ComputeEvent:
        k = int(self.input_kind[i])
        source = None if k < 0 else Action(int(self.input_stage[i]), KIND_CODES[k], int(self.input_microbatch[i]))
        return ComputeEvent(int(self.rank[i]), self.actions.action(i), float(self.start[i]), float(self.end[i]), source,
                            float(self.input_ready[i]), float(self.input_produced[i]))

    def rank_events(self, rank: int) -> tuple[ComputeEvent, ...]:
        return tuple(self.event(i) for i in range(int(self.offsets[rank]), int(self.offsets[rank + 1])))

    @classmethod
    def of_events(cls, per_rank: Sequence[Sequence[ComputeEvent]]) -> "EventColumns":
        """From event objects (a timeline changed by hand, as tests of the checks do)."""
        flat = [e for events in per_rank for e in events]
        actions = ActionColumns.of_actions([[e.action for e in events] for events in per_rank])
        code = {k: c for c, k in enumerate(KIND_CODES)}
        sources = [e.input_from for e in flat]
        times, indices = np.float64, np.int64
        return cls(actions.offsets, actions.stage, actions.kind, actions.microbatch,
                   np.array([e.start for e in flat], dtype=times), np.array([e.end for e in flat], dtype=times),
                   np.array([-1 if a is None else a.stage for a in sources], dtype=indices),
                   np.array([-1 if a is None else code[a.kind] for a in sources], dtype=indices),
                   np.array([-1 if a is None else a.microbatch for a in sources], dtype=indices),
                   np.array([e.input_ready for e in flat], dtype=times),
                   np.array([e.input_produced for e in flat], dtype=times))


@dataclass(frozen=True, eq=False)
class Timeline:
    order: ScheduleOrder
    costs: StageCosts
    events: EventColumns
    collectives: tuple[CollectiveEvent, ...]  # per rank (zero-length without data parallelism)
    step_s: float

    @cached_property
    def compute(self) -> tuple[tuple[ComputeEvent, ...], ...]:
        """Per rank, in order, as objects (for small timelines: each is made on demand)."""
        return tuple(self.events.rank_events(r) for r in range(self.events.offsets.size - 1))

    def rank_slice(self, rank: int) -> slice:
        return slice(int(self.events.offsets[rank]), int(self.events.offsets[rank + 1]))

    def busy_s(self, rank: int) -> float:
        part = self.rank_slice(rank)
        # Python's sum over the durations in order: the float the report has always had.
        return sum((self.events.end[part] - self.events.start[part]).tolist())

    def last_end(self, rank: int) -> float:
        """When the rank's last compute event ends (0.0 without any)."""
        part = self.rank_slice(rank)
        return float(self.events.end[part.stop - 1]) if part.stop > part.start else 0.0

    def transfer_columns(self) -> "TransferColumns":
        """Activations and gradients sent to another rank, rank after rank in each rank's
        order of its actions."""
        ev, order, costs = self.events, self.order, self.costs
        S = order.stages
        holder = np.asarray(order.stage_rank + (-1,), dtype=np.int64)  # stage S (and -1): no rank
        rank = ev.rank
        is_f = ev.kind == F_CODE
        is_g = (ev.kind == B_CODE) | (ev.kind == I_CODE)
        to = np.where(is_f, holder[np.minimum(ev.stage + 1, S)], np.where(is_g, holder[ev.stage - 1], -1))
        sends = np.flatnonzero((to >= 0) & (to != rank) & np.where(is_f, ev.stage < S - 1, ev.stage > 0))
        activation = is_f[sends]
        stage = ev.stage[sends]
        # The delay of the boundary crossed: s -> s+1 forward, s -> s-1 backward (padded).
        forward_s = np.asarray(costs.send_forward_s + (0.0,), dtype=np.float64)
        backward_s = np.asarray((0.0,) + costs.send_backward_s, dtype=np.float64)
        start = ev.end[sends]
        end = start + np.where(activation, forward_s[stage], backward_s[stage])
        return TransferColumns(rank[sends], to[sends], stage, np.where(activation, stage + 1, stage - 1),
                               ev.microbatch[sends], activation, start, end)

    @property
    def transfers(self) -> tuple[TransferEvent, ...]:
        """`transfer_columns` as objects."""
        t = self.transfer_columns()
        return tuple(TransferEvent("activation" if a else "gradient", r, d, s, ds, mb, st, en) for r, d, s, ds, mb, a, st, en
                     in zip(t.src_rank.tolist(), t.dst_rank.tolist(), t.src_stage.tolist(), t.dst_stage.tolist(),
                            t.microbatch.tolist(), t.activation.tolist(), t.start.tolist(), t.end.tolist()))


@dataclass(frozen=True, eq=False)
class TransferColumns:
    """Transfers, one array per field of `TransferEvent` (`activation`: True for an
    activation, False for a gradient)."""

    src_rank: np.ndarray
    dst_rank: np.ndarray
    src_stage: np.ndarray
    dst_stage: np.ndarray
    microbatch: np.ndarray
    activation: np.ndarray
    start: np.ndarray
    end: np.ndarray


class ScheduleDeadlock(CollcError):
    """A schedule whose order waits on an input that is produced later on the same rank."""


# Rounds narrower than this (actions per round, estimated) go to the event loop: a round
# is some twenty array operations whatever its width.
MIN_WAVEFRONT_WIDTH = 64


def build_timeline(order: ScheduleOrder, costs: StageCosts, span: Span | None = None,
                   engine: str = "auto") -> Timeline:
    """`engine`: "wavefront", "loop", or "auto" (the wavefront where its rounds are wide
    and the order is one it runs; they give the same timeline)."""
    columns = order.columns
    if engine not in ("auto", "wavefront", "loop"):
        raise ValueError(f"unknown timeline engine {engine!r}")
    # The garbage collector would walk the growing lists again and again; the engines
    # create no cycles (see collc.ir.heap).
    with few_collections():
        run = None
        if engine == "wavefront" or (engine == "auto" and wide_enough(order)):
            run = _run_by_wavefront(order, costs)
        if run is None:
            run = _run_by_loop(order, costs, span)
        start, end, source, ready, produced = run
        return _timeline(order, costs, columns, start, end, source, ready, produced)


def wide_enough(order: ScheduleOrder) -> bool:
    """Whether the wavefront's rounds average MIN_WAVEFRONT_WIDTH actions or more: they
    are at least as many as the longest rank's actions and the forward and backward
    through every stage."""
    per_rank = np.diff(order.columns.offsets)
    rounds = int(per_rank.max(initial=0)) + 2 * order.stages
    return len(order.columns) >= MIN_WAVEFRONT_WIDTH * rounds


def _durations(order: ScheduleOrder, costs: StageCosts) -> np.ndarray:
    """Seconds of each action."""
    by_kind = np.array([costs.forward_s, costs.backward_s, costs.input_grad_s, costs.weight_grad_s], dtype=np.float64)
    return by_kind[order.columns.kind, order.columns.stage]


Run = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]  # start, end, source, ready, produced


def _timeline(order: ScheduleOrder, costs: StageCosts, columns: ActionColumns, start: np.ndarray, end: np.ndarray,
              source: np.ndarray, ready: np.ndarray, produced: np.ndarray) -> Timeline:
    def of_source(field: np.ndarray) -> np.ndarray:
        """`field` of each event's input (-1 where there is none)."""
        out = np.full(source.size, -1, dtype=np.int64)
        has = source >= 0
        out[has] = field[source[has]]
        return out

    events = EventColumns(columns.offsets, columns.stage, columns.kind, columns.microbatch, start, end,
                          of_source(columns.stage), of_source(columns.kind), of_source(columns.microbatch),
                          ready, produced)
    collectives = []
    step = 0.0
    for r in range(order.ranks):
        lo, hi = int(columns.offsets[r]), int(columns.offsets[r + 1])
        last = float(end[hi - 1]) if hi > lo else 0.0
        finish = last + costs.gradient_s[r]
        collectives.append(CollectiveEvent(r, last, finish))
        step = max(step, finish)
    return Timeline(order, costs, events, tuple(collectives), step)


def _producers(order: ScheduleOrder) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """The index of the forward, of the input gradient (B or I) and of the W of every
    (stage, micro-batch) slot; None where a slot's is repeated, or a stage or
    micro-batch is outside the order's (the event loop names the fault)."""
    c = order.columns
    S, M = order.stages, order.microbatches
    slots = S * M
    if len(c) and (c.stage.min() < 0 or c.stage.max() >= S or c.microbatch.min() < 0 or c.microbatch.max() >= M):
        return None
    slot = c.stage * M + c.microbatch
    out = []
    for kinds in ((F_CODE,), (B_CODE, I_CODE), (W_CODE,)):
        mask = np.isin(c.kind, kinds)
        which = slot[mask]
        if which.size and np.bincount(which, minlength=slots).max() > 1:
            return None
        index = np.full(slots, -1, dtype=np.int64)
        index[which] = np.flatnonzero(mask)
        out.append(index)
    return out[0], out[1], out[2]


def _run_by_wavefront(order: ScheduleOrder, costs: StageCosts) -> Run | None:
    """The timeline by rounds of array operations; None where the order repeats an action
    or deadlocks (the event loop then says how).

    Every action waits on the previous action of its rank (`prev`) and on at most two
    inputs: `first` (a forward's previous stage, a backward's own forward, a W's own
    input gradient) and `second` (a backward's next-stage input gradient). Missing
    ones point at two extra slots of `end`: one holding 0.0 (the step's start, as for
    a rank's first action or a first stage's forward), one holding -inf (an input that
    never wins). Each action takes exactly the event loop's float operations."""
    c = order.columns
    n = len(c)
    found = _producers(order)
    if found is None:
        return None
    f_at, g_at, w_at = found
    S, M = order.stages, order.microbatches
    zero, never = n, n + 1
    slot = c.stage * M + c.microbatch
    rank = np.repeat(np.arange(order.ranks, dtype=np.int64), np.diff(c.offsets))
    holder = np.asarray(order.stage_rank, dtype=np.int64)
    send_f = np.asarray(costs.send_forward_s + (0.0,), dtype=np.float64)  # padded: indexed by stage - 1 >= -1
    send_b = np.asarray(costs.send_backward_s + (0.0,), dtype=np.float64)  # padded: indexed by stage <= S - 1
    is_f, is_w = c.kind == F_CODE, c.kind == W_CODE
    is_g = ~is_f & ~is_w
    has_prev_stage, has_next_stage = c.stage > 0, c.stage < S - 1
    prev_slot = np.where(has_prev_stage, slot - M, 0)
    next_slot = np.where(has_next_stage, slot + M, 0)

    first = np.where(is_f, np.where(has_prev_stage, f_at[prev_slot], zero), np.where(is_g, f_at[slot], g_at[slot]))
    first_delay = np.where(is_f & has_prev_stage & (holder[np.maximum(c.stage - 1, 0)] != rank),
                           send_f[c.stage - 1], 0.0)
    second = np.where(is_g & has_next_stage, g_at[next_slot], never)
    second_delay = np.where(is_g & has_next_stage & (holder[np.minimum(c.stage + 1, S - 1)] != rank),
                            send_b[c.stage], 0.0)
    if (first < 0).any() or (second < 0).any():  # an input that never runs: the loop deadlocks
        return None
    starts_rank = np.zeros(n, dtype=bool)
    starts_rank[c.offsets[:-1][np.diff(c.offsets) > 0]] = True
    prev = np.where(starts_rank, zero, np.arange(n, dtype=np.int64) - 1)
    # Who waits on each action: the next on its rank, and the consumers of its output.
    ends_rank = np.roll(starts_rank, -1)
    if n:
        ends_rank[-1] = True
    next_on_rank = np.where(ends_rank, -1, np.arange(n, dtype=np.int64) + 1)
    consumer_a = np.where(is_f, np.where(has_next_stage, f_at[next_slot], -1),
                          np.where(is_g, np.where(has_prev_stage, g_at[prev_slot], -1), -1))
    consumer_b = np.where(is_f, g_at[slot], np.where(is_g, w_at[slot], -1))
    duration = _durations(order, costs)

    # One gather per round for each kind of field: the inputs and the waiters of an
    # action side by side, its delays and duration side by side.
    index_type = np.int32 if n + 2 < 2**31 else np.int64  # half the memory to walk
    links = np.stack((first, second, prev, next_on_rank, consumer_a, consumer_b), axis=1).astype(index_type)
    times = np.stack((first_delay, second_delay, duration), axis=1)
    end = np.empty(n + 2, dtype=np.float64)
    end[zero], end[never] = 0.0, -np.inf
    start = np.empty(n, dtype=np.float64)
    done = np.zeros(n + 2, dtype=bool)
    done[zero] = done[never] = True
    # Where each waiter was last listed in a round: keeps one copy of an action that two
    # inputs finished in the same round.
    listed = np.zeros(n, dtype=np.int64)
    frontier = np.flatnonzero(done[links[:, :3]].all(axis=1))
    ran = 0
    while frontier.size:
        linked = links[frontier]
        timed = times[frontier]
        inputs = end[linked[:, :3]]
        a = inputs[:, 0] + timed[:, 0]
        b = inputs[:, 1] + timed[:, 1]
        t = np.maximum(inputs[:, 2], np.where(b >= a, b, a))
        start[frontier] = t
        end[frontier] = t + timed[:, 2]
        done[frontier] = True
        ran += frontier.size
        waiting = linked[:, 3:].ravel()
        waiting = waiting[waiting >= 0]
        place = np.arange(waiting.size)
        listed[waiting] = place
        waiting = waiting[listed[waiting] == place]
        frontier = waiting[done[links[waiting, :3]].all(axis=1)]
    if ran < n:
        return None
    # The inputs each action waited on, as the loop records them.
    a = end[first] + first_delay
    b = end[second] + second_delay
    second_won = b >= a
    ready = np.where(second_won, b, a)
    produced = np.where(second_won, end[second], end[first])
    source = np.where(second_won, second, np.where(first == zero, -1, first))
    return start, end[:n].copy(), source, ready, produced


def _run_by_loop(order: ScheduleOrder, costs: StageCosts, span: Span | None) -> Run:
    S, M, p = order.stages, order.microbatches, order.ranks
    n = S * M
    nan = float("nan")
    c = order.columns
    offsets = c.offsets.tolist()
    total = offsets[-1]
    # Finish times of forwards, input gradients (B or I) and weight gradients, by
    # stage * M + micro-batch; NaN until produced. The events producing them, likewise.
    fin_f, fin_g, fin_w = [nan] * n, [nan] * n, [nan] * n
    by_f, by_g = [-1] * n, [-1] * n
    stage_rank = order.stage_rank
    fwd_x, bwd_x = costs.send_forward_s, costs.send_backward_s
    durations = (costs.forward_s, costs.backward_s, costs.input_grad_s, costs.weight_grad_s)
    kinds, stages, mbs = c.kind.tolist(), c.stage.tolist(), c.microbatch.tolist()
    start_at, end_at, ready_at, produced_at = [0.0] * total, [0.0] * total, [0.0] * total, [0.0] * total
    source_of = [-1] * total
    waiting: dict[int, list[int]] = {}
    pos = [0] * p
    free_at = [0.0] * p
    stack = list(range(p - 1, -1, -1))
    while stack:
        r = stack.pop()
        base = offsets[r]
        j = base + pos[r]
        stop = offsets[r + 1]
        t_free = free_at[r]
        while j < stop:
            k, s, mb = kinds[j], stages[j], mbs[j]
            idx = s * M + mb
            ready, produced, source = 0.0, 0.0, -1
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
            begin = t_free if t_free > ready else ready
            end = begin + durations[k][s]
            t_free = end
            start_at[j], end_at[j], ready_at[j], produced_at[j], source_of[j] = begin, end, ready, produced, source
            if k == 0:
                if fin_f[idx] == fin_f[idx]:
                    raise CollcError(f"schedule runs {c.action(j)} twice", span)
                fin_f[idx] = end
                by_f[idx] = j
                key = idx
            elif k == 3:
                if fin_w[idx] == fin_w[idx]:
                    raise CollcError(f"schedule runs {c.action(j)} twice", span)
                fin_w[idx] = end
                key = -1
            else:
                if fin_g[idx] == fin_g[idx]:
                    raise CollcError(f"schedule runs {c.action(j)} twice (or both B and I for micro-batch {mb} of "
                                     f"stage {s})", span)
                fin_g[idx] = end
                by_g[idx] = j
                key = n + idx
            if key >= 0 and waiting:
                woken = waiting.pop(key, None)
                if woken:
                    stack.extend(woken)
            j += 1
        pos[r] = j - base
        free_at[r] = t_free
    stuck = [r for r in range(p) if offsets[r] + pos[r] < offsets[r + 1]]
    if stuck:
        shown = "; ".join(f"rank {r} at {c.action(offsets[r] + pos[r])} (action {pos[r] + 1})" for r in stuck[:4])
        raise ScheduleDeadlock(f"schedule '{order.name}' deadlocks: every unfinished rank waits on an input "
                               f"that is never produced before it: {shown}", span)
    return (np.array(start_at, dtype=np.float64), np.array(end_at, dtype=np.float64),
            np.array(source_of, dtype=np.int64), np.array(ready_at, dtype=np.float64),
            np.array(produced_at, dtype=np.float64))
