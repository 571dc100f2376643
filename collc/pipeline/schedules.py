"""Pipeline schedules as data: the ordered compute actions of every pipeline rank.

An action is (stage, kind, micro-batch) with PyTorch's letters: F forward, B full
backward, I input-gradient backward, W weight-gradient backward. Stages are *virtual*
stages numbered globally along the model (0 .. ranks*chunks-1); `stage_rank` says which
pipeline rank holds each one: a loop (stage s on rank s mod p) for interleaved 1F1B, a V
(rank r holds r and 2p-1-r) for DualPipeV, or whatever a CSV file says.

The orders built here are the textbook ones: GPipe (all forwards, then all backwards),
1F1B (PipeDream-flush: p-1-r warm-up forwards on rank r, then one forward and one
backward in turn), interleaved 1F1B (Megatron-LM's order), and ZB-H1 (zero-bubble with
1F1B's memory: the weight-gradient halves fill what would be bubbles).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from collc.diagnostics import CollcError, Span


class Kind(str, Enum):
    F = "F"
    B = "B"
    I = "I"  # noqa: E741 - PyTorch's letter for the input-gradient backward
    W = "W"


@dataclass(frozen=True, slots=True)
class Action:
    stage: int
    kind: Kind
    microbatch: int

    def __str__(self) -> str:
        # `_value_`, not `value`: the latter is a descriptor call, a noticeable share of
        # naming a million bubbles' inputs.
        return f"{self.stage}{self.kind._value_}{self.microbatch}"


@dataclass(frozen=True)
class ScheduleOrder:
    """Every rank's compute actions in execution order."""

    name: str
    ranks: int
    stages: int  # virtual stages
    microbatches: int
    stage_rank: tuple[int, ...]  # virtual stage -> pipeline rank
    actions: tuple[tuple[Action, ...], ...]  # per rank

    @property
    def chunks(self) -> int:
        return self.stages // self.ranks

    @property
    def splits_backward(self) -> bool:
        return any(a.kind is Kind.I for acts in self.actions for a in acts)

    def stages_of(self, rank: int) -> list[int]:
        return [s for s, r in enumerate(self.stage_rank) if r == rank]


def loop_placement(ranks: int, chunks: int) -> tuple[int, ...]:
    return tuple(s % ranks for s in range(ranks * chunks))


def _positive(value: int, what: str, span: Span | None) -> None:
    if value < 1:
        raise CollcError(f"{what} must be at least 1, got {value}", span)


def gpipe(ranks: int, microbatches: int) -> ScheduleOrder:
    acts = tuple(tuple([Action(r, Kind.F, i) for i in range(microbatches)]
                       + [Action(r, Kind.B, i) for i in range(microbatches)]) for r in range(ranks))
    return ScheduleOrder("gpipe", ranks, ranks, microbatches, loop_placement(ranks, 1), acts)


def one_f_one_b(ranks: int, microbatches: int) -> ScheduleOrder:
    out = []
    for r in range(ranks):
        warmup = min(ranks - 1 - r, microbatches)
        seq = [Action(r, Kind.F, i) for i in range(warmup)]
        for i in range(microbatches - warmup):
            seq += [Action(r, Kind.F, warmup + i), Action(r, Kind.B, i)]
        seq += [Action(r, Kind.B, i) for i in range(microbatches - warmup, microbatches)]
        out.append(tuple(seq))
    return ScheduleOrder("1f1b", ranks, ranks, microbatches, loop_placement(ranks, 1), tuple(out))


def interleaved(ranks: int, microbatches: int, chunks: int, span: Span | None = None) -> ScheduleOrder:
    """Megatron-LM's interleaved 1F1B: forwards go through the chunks in groups of
    `ranks` micro-batches; rank r warms up with 2(p-1-r) + (v-1)p forwards."""
    if chunks == 1:
        return one_f_one_b(ranks, microbatches)
    if microbatches % ranks:
        raise CollcError(f"interleaved 1F1B needs the micro-batches ({microbatches}) to be a multiple of the "
                         f"stages ({ranks})", span)
    p, v = ranks, chunks
    total = microbatches * v

    def pick(k: int, kind: Kind, r: int) -> Action:
        group = (k // p) % v
        chunk = group if kind is Kind.F else v - 1 - group
        return Action(chunk * p + r, kind, (k // (p * v)) * p + k % p)

    out = []
    for r in range(p):
        warmup = min((p - 1 - r) * 2 + (v - 1) * p, total)
        seq = [pick(k, Kind.F, r) for k in range(warmup)]
        for i in range(total - warmup):
            seq += [pick(warmup + i, Kind.F, r), pick(i, Kind.B, r)]
        seq += [pick(k, Kind.B, r) for k in range(total - warmup, total)]
        out.append(tuple(seq))
    return ScheduleOrder(f"interleaved(v={v})", p, p * v, microbatches, loop_placement(p, v), tuple(out))


def zb_h1(ranks: int, microbatches: int) -> ScheduleOrder:
    """ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism"): 1F1B with the backward split
    into I (input gradient) and W (weight gradient), where rank r runs its first r
    steady-state iterations as F, I only and so lags r weight gradients behind, which
    fill the cool-down; the lagging Ws run at the end. Each rank keeps at most p
    micro-batches in flight (forward done, W not): 1F1B's peak, that of its first rank.
    This is the order of torch.distributed.pipelining's zero-bubble 1F1B with one stage
    per rank (`num_1f1b_microbatches = rank`)."""
    p, m = ranks, microbatches
    out = []
    for r in range(p):
        warmup = min(p - 1 - r, m)
        seq = [Action(r, Kind.F, i) for i in range(warmup)]
        w_next = 0
        for k in range(m):
            if warmup + k < m:
                seq.append(Action(r, Kind.F, warmup + k))
            seq.append(Action(r, Kind.I, k))
            if k >= r:  # the first r iterations leave their W for later
                seq.append(Action(r, Kind.W, w_next))
                w_next += 1
        seq += [Action(r, Kind.W, i) for i in range(w_next, m)]
        out.append(tuple(seq))
    return ScheduleOrder("zb-h1", p, p, m, loop_placement(p, 1), tuple(out))


def build(kind: str, ranks: int, microbatches: int, chunks: int = 1, span: Span | None = None) -> ScheduleOrder:
    """A built-in schedule by the name the language uses."""
    _positive(ranks, "the number of stages", span)
    _positive(microbatches, "the number of micro-batches", span)
    _positive(chunks, "the number of model chunks", span)
    if chunks > 1 and kind != "interleaved":
        raise CollcError(f"`chunks` applies to the interleaved schedule, not to {kind}", span)
    if kind == "gpipe":
        return gpipe(ranks, microbatches)
    if kind == "1f1b":
        return one_f_one_b(ranks, microbatches)
    if kind == "interleaved":
        return interleaved(ranks, microbatches, chunks, span)
    if kind == "zb-h1":
        return zb_h1(ranks, microbatches)
    raise CollcError(f"unknown schedule '{kind}' (expected gpipe, 1f1b, interleaved, zb-h1, or a .csv file)", span)
