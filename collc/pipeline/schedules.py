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
        return f"{self.stage}{self.kind.value}{self.microbatch}"


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
    """ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism"): backward split into I and
    W; rank r keeps at most p - r micro-batches in flight (forward done, W not), the
    same bound as 1F1B, and runs a W only when no I or F can run, so the weight
    gradients fill the bubbles. The order is found by list scheduling with unit costs
    (F = I = W = 1, free communication), as the paper's handcrafted schedule assumes;
    the timeline then runs it with the real costs."""
    p, m = ranks, microbatches
    inf = float("inf")
    f_done = [[inf] * m for _ in range(p)]
    i_done = [[inf] * m for _ in range(p)]
    next_f, next_i = [0] * p, [0] * p
    pending_w: list[list[int]] = [[] for _ in range(p)]
    in_flight = [0] * p
    seqs: list[list[Action]] = [[] for _ in range(p)]
    remaining = 3 * p * m
    t = 0
    while remaining:
        if t > 4 * p * m + 4 * p:  # pragma: no cover - every rank always progresses
            raise AssertionError("ZB-H1 list scheduling made no progress")
        for r in range(p):
            i = next_i[r]
            if i < m and f_done[r][i] <= t and (r == p - 1 or i_done[r + 1][i] <= t):
                seqs[r].append(Action(r, Kind.I, i))
                i_done[r][i] = t + 1
                next_i[r] += 1
                pending_w[r].append(i)
            elif next_f[r] < m and in_flight[r] < p - r and (r == 0 or f_done[r - 1][next_f[r]] <= t):
                f = next_f[r]
                seqs[r].append(Action(r, Kind.F, f))
                f_done[r][f] = t + 1
                next_f[r] += 1
                in_flight[r] += 1
            elif pending_w[r]:
                seqs[r].append(Action(r, Kind.W, pending_w[r].pop(0)))
                in_flight[r] -= 1
            else:
                continue
            remaining -= 1
        t += 1
    return ScheduleOrder("zb-h1", p, p, m, loop_placement(p, 1), tuple(tuple(s) for s in seqs))


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
