"""Pipeline schedules as data: the ordered compute actions of every pipeline rank.

An action is (stage, kind, micro-batch) with PyTorch's letters: F forward, B full
backward, I input-gradient backward, W weight-gradient backward. Stages are *virtual*
stages numbered globally along the model (0 .. ranks*chunks-1); `stage_rank` says which
pipeline rank holds each one: a loop (stage s on rank s mod p) for interleaved 1F1B, a V
(rank r holds r and 2p-1-r) for DualPipeV, or whatever a CSV file says.

An order keeps its actions as NumPy columns (`ActionColumns`: stage, kind code,
micro-batch, rank after rank): a 1,000-stage, 1,000-micro-batch 1F1B order is two
million actions, built by array operations; the `Action` objects are made only when
asked for (`ScheduleOrder.actions`).

The orders built here are the textbook ones: GPipe (all forwards, then all backwards),
1F1B (PipeDream-flush: p-1-r warm-up forwards on rank r, then one forward and one
backward in turn), interleaved 1F1B (Megatron-LM's order), and ZB-H1 (zero-bubble with
1F1B's memory: the weight-gradient halves fill what would be bubbles).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from functools import cached_property
from typing import Sequence

import numpy as np

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


KIND_CODES = (Kind.F, Kind.B, Kind.I, Kind.W)  # a kind's code is its index here
F_CODE, B_CODE, I_CODE, W_CODE = range(4)


@dataclass(frozen=True, eq=False)
class ActionColumns:
    """Actions rank after rank, one array per field: rank r's are
    [offsets[r], offsets[r + 1])."""

    offsets: np.ndarray  # int64, ranks + 1
    stage: np.ndarray  # int64
    kind: np.ndarray  # int64 code: index in KIND_CODES
    microbatch: np.ndarray  # int64

    def __len__(self) -> int:
        return int(self.stage.size)

    def action(self, i: int) -> Action:
        return Action(int(self.stage[i]), KIND_CODES[int(self.kind[i])], int(self.microbatch[i]))

    def rank_actions(self, rank: int) -> tuple[Action, ...]:
        lo, hi = int(self.offsets[rank]), int(self.offsets[rank + 1])
        kinds = KIND_CODES
        return tuple(Action(s, kinds[k], m) for s, k, m in zip(self.stage[lo:hi].tolist(), self.kind[lo:hi].tolist(),
                                                                self.microbatch[lo:hi].tolist()))

    @classmethod
    def of_actions(cls, actions: Sequence[Sequence[Action]]) -> "ActionColumns":
        flat = [a for acts in actions for a in acts]
        n = len(flat)
        code = {k: c for c, k in enumerate(KIND_CODES)}
        offsets = np.zeros(len(actions) + 1, dtype=np.int64)
        np.cumsum([len(acts) for acts in actions], out=offsets[1:])
        return cls(offsets, np.fromiter((a.stage for a in flat), np.int64, n),
                   np.fromiter((code[a.kind] for a in flat), np.int64, n),
                   np.fromiter((a.microbatch for a in flat), np.int64, n))

    @classmethod
    def of_grid(cls, stage: np.ndarray, kind: np.ndarray, microbatch: np.ndarray) -> "ActionColumns":
        """From (ranks, actions per rank) arrays, every rank running as many actions."""
        ranks, per_rank = stage.shape
        offsets = np.arange(ranks + 1, dtype=np.int64) * per_rank
        return cls(offsets, stage.astype(np.int64).ravel(), kind.astype(np.int64).ravel(),
                   microbatch.astype(np.int64).ravel())


@dataclass(frozen=True, eq=False)
class ScheduleOrder:
    """Every rank's compute actions in execution order."""

    name: str
    ranks: int
    stages: int  # virtual stages
    microbatches: int
    stage_rank: tuple[int, ...]  # virtual stage -> pipeline rank
    columns: ActionColumns

    @classmethod
    def of_actions(cls, name: str, ranks: int, stages: int, microbatches: int, stage_rank: tuple[int, ...],
                   actions: Sequence[Sequence[Action]]) -> "ScheduleOrder":
        order = cls(name, ranks, stages, microbatches, stage_rank, ActionColumns.of_actions(actions))
        order.__dict__["actions"] = tuple(tuple(acts) for acts in actions)  # the cached property's value
        return order

    @cached_property
    def actions(self) -> tuple[tuple[Action, ...], ...]:
        """Per rank, as objects (made on first use: two million take seconds)."""
        return tuple(self.columns.rank_actions(r) for r in range(self.ranks))

    @property
    def chunks(self) -> int:
        return self.stages // self.ranks

    @property
    def splits_backward(self) -> bool:
        return bool((self.columns.kind == I_CODE).any())

    def stages_of(self, rank: int) -> list[int]:
        return [s for s, r in enumerate(self.stage_rank) if r == rank]


def loop_placement(ranks: int, chunks: int) -> tuple[int, ...]:
    return tuple(s % ranks for s in range(ranks * chunks))


def _positive(value: int, what: str, span: Span | None) -> None:
    if value < 1:
        raise CollcError(f"{what} must be at least 1, got {value}", span)


def gpipe(ranks: int, microbatches: int) -> ScheduleOrder:
    """All forwards, then all backwards."""
    position = np.arange(2 * microbatches)
    stage = np.repeat(np.arange(ranks)[:, None], 2 * microbatches, axis=1)
    kind = np.broadcast_to(np.where(position < microbatches, F_CODE, B_CODE), stage.shape)
    mb = np.broadcast_to(position % microbatches, stage.shape)
    return ScheduleOrder("gpipe", ranks, ranks, microbatches, loop_placement(ranks, 1),
                         ActionColumns.of_grid(stage, kind, mb))


def one_f_one_b(ranks: int, microbatches: int) -> ScheduleOrder:
    """Rank r: w = min(p-1-r, m) warm-up forwards, then one forward and one backward in
    turn, then the last w backwards. Position j of rank r's 2m actions is worked out for
    every (r, j) at once:
    j < w: forward j; w <= j < 2m - w: forward w + (j-w)/2 or backward (j-w)/2 by the
    parity of j - w; j >= 2m - w: backward j - m."""
    m = microbatches
    warmup = np.minimum(ranks - 1 - np.arange(ranks), m)[:, None]
    j = np.arange(2 * m)[None, :]
    steady = j - warmup
    in_warmup, in_cooldown = j < warmup, j >= 2 * m - warmup
    is_forward = in_warmup | (~in_cooldown & (steady % 2 == 0))
    mb = np.where(in_warmup, j, np.where(in_cooldown, j - m, np.where(is_forward, warmup + steady // 2, steady // 2)))
    stage = np.broadcast_to(np.arange(ranks)[:, None], mb.shape)
    kind = np.where(is_forward, F_CODE, B_CODE)
    return ScheduleOrder("1f1b", ranks, ranks, microbatches, loop_placement(ranks, 1),
                         ActionColumns.of_grid(stage, kind, mb))


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
    return ScheduleOrder.of_actions(f"interleaved(v={v})", p, p * v, microbatches, loop_placement(p, v), out)


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
    return ScheduleOrder.of_actions("zb-h1", p, p, m, loop_placement(p, 1), out)


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
