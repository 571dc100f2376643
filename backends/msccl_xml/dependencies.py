"""`msccl-deps`: step numbers, cross-threadblock dependencies and `nop` steps.

The threadblocks of a GPU share nothing but flags: a step with `depid=B deps=S` waits
until threadblock B has finished its step S (B publishes progress after steps marked
`hasdep="1"`), and a step can name one dependency only, so a step that must wait for
several threadblocks gets one `nop` step per extra dependency immediately before it
(the executor collects the nops' dependencies into the next step's list; the step itself
must carry one too, or the executor rejects the file).

Why the program cannot deadlock. Every step has a *place*: the key (schedule step,
phase, op position, ...) of its first half; a fused step's first half is its receive.
Threadblocks run their steps in order of place. Then every wait points to an earlier
place:

- within a threadblock, by construction;
- a receive waits for its message, sent by a step whose place is at most the send's
  key, which is below the receive's key (same schedule step, send phase before receive
  phase; a forwarded message was received at an earlier schedule step);
- a dependency waits for a half that must precede one of the step's halves: an ancestor
  in the schedule's dependency graph, hence at an earlier schedule step; `msccl-fuse`
  only fuses a send whose other predecessors all precede its receive.

And every connection delivers its messages in the order they are received: the receiver
takes them in key order, and the sender sends them in key order (for plain sends by
construction, for fused ones by the check in `msccl-fuse`). So with FIFO connections
every step eventually runs: the unfinished step with the earliest place can always go.
(The argument takes connections as unbounded FIFOs, as `collc verify` simulates them; a
real connection holds a few slices, which only delays a sender that runs ahead.)

Redundant dependencies are dropped: a wait is implied when the step (or an earlier step
of its threadblock) already waited for a later step of that threadblock, or for a step
that itself (transitively) waited for it.
"""

from __future__ import annotations

import bisect
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from enum import Enum
from itertools import chain
from operator import itemgetter
from typing import NamedTuple

import numpy as np

from collc.backends.msccl_xml.limits import MAX_XML_NODES
from collc.backends.msccl_xml.model import StepType
from collc.backends.msccl_xml.program import (
    HALF_KINDS, HalfKind, LStep, LThreadblock, Program, Stage, collections_paused, make_step, remember_last,
)
from collc.diagnostics import CollcError
from collc.passes.base import CompileUnit, Pass, register_pass

# Made once: np.iinfo builds an object per call (5 us), and `number` runs once per
# step, a million times at 1,024 ranks.
_INT64_MAX = int(np.iinfo(np.int64).max)


@remember_last
def order_steps(program: Program) -> Program:
    if program.stage is Stage.ORDERED:
        raise CollcError("msccl-deps has already run on this program")
    layout, waits = _ordering(program)
    number = _numbers(layout, waits)
    targets = {target for ws in waits.values() for target in ws}
    reducing = layout.tbs_with_reductions(program)
    gpus = []
    k = 0  # global threadblock number
    for g in program.gpus:
        tbs = []
        for tb in g.tbs:
            first = layout.tb_start[k]
            touched = layout.touched[k] if k < len(layout.touched) else False
            if not touched and k not in reducing:
                tbs.append(tb)  # most threadblocks: no step waits on another or is waited for
            else:
                steps = _numbered_steps(tb, first, waits, targets, number, layout)
                tbs.append(LThreadblock(tb.id, tb.send, tb.recv, tb.chan, _keep_reductions_apart(steps, program)))
            k += 1
        gpus.append(replace(g, tbs=tuple(tbs)))
    return replace(program, gpus=tuple(gpus), stage=Stage.ORDERED)


class _Ordering(NamedTuple):
    layout: _Layout
    waits: dict[int, list[int]]


@remember_last
def _ordering(program: Program) -> _Ordering:
    """Every step numbered and the waits between threadblocks decided: what fixes each
    threadblock's length (`ordered_lengths`), kept so that `order_steps` of the same
    program builds its steps from it."""
    ordering = _ordering_within(program, None)
    assert ordering is not None  # nothing to give up without a limit
    return ordering


def _ordering_within(program: Program, max_steps: int | None) -> _Ordering | None:
    """`_ordering`, or None as soon as some threadblock is known to get more than
    `max_steps` steps, nops included (None: never give up)."""
    # Threadblock ids are positions in each GPU's list (msccl-threadblocks numbers them so).
    layout = _Layout(program)
    if max_steps is not None and layout.steps and int(np.diff([*layout.tb_start, layout.steps]).max()) > max_steps:
        return None
    needs = _cross_needs(program, layout)
    limit = _Limit.NONE if max_steps is None else _limit_kind(program, layout, needs)
    waits = _waits(program, layout, needs, max_steps if limit is not _Limit.NONE else None,
                   chained=limit is _Limit.CHAINED)
    if waits is None:
        return None
    if limit is not _Limit.CHAINED and _most_xml_nodes(program, layout, waits) > MAX_XML_NODES:
        _chain_waits(layout, waits)
    return _Ordering(layout, waits)


def ordered_lengths(program: Program) -> list[int]:
    """The steps of every threadblock (GPU by GPU, in order) once `order_steps` has
    numbered them, nop steps included, without building them: msccl-threadblocks
    measures every placement it tries, and most are given up (the steps are built only
    for the one kept, when msccl-deps asks)."""
    return _lengths(_ordering(program))


def ordered_lengths_within(program: Program, max_steps: int) -> list[int] | None:
    """`ordered_lengths`, or None as soon as some threadblock is known to get more than
    `max_steps` steps: a placement that does not fit is given up without ordering the
    rest of it (at 1,024 GPUs a spread placement tried first takes a tenth of the
    compile to order in full). Where the lengths are returned, `order_steps` of the same
    program reuses the work."""
    ordering = _ordering_within(program, max_steps)
    if ordering is None:
        return None
    _ordering.remember(program, ordering)
    return _lengths(ordering)


def _lengths(ordering: _Ordering) -> list[int]:
    layout, waits = ordering
    lengths = np.diff(np.asarray([*layout.tb_start, layout.steps], dtype=np.int64))
    if waits:
        waiting = np.fromiter(waits, np.int64, len(waits))
        nops = np.fromiter(map(len, waits.values()), np.int64, len(waits)) - 1
        np.add.at(lengths, layout.tb_of_step[waiting], nops)
    return lengths.tolist()


_step_halves = itemgetter(1)  # LStep.halves, read at C level


class _Layout:
    """Every step of the program numbered globally (GPU by GPU, threadblock by
    threadblock), as arrays: its threadblock (global number), its index there, the
    place of its first half; and the step of every half."""

    def __init__(self, program: Program):
        tbs = [tb for g in program.gpus for tb in g.tbs]
        self.gpu_of_tb = np.repeat(np.arange(len(program.gpus), dtype=np.int64),
                                   [len(g.tbs) for g in program.gpus])
        self.local_tb = np.concatenate([np.arange(len(g.tbs), dtype=np.int64) for g in program.gpus]) \
            if tbs else np.zeros(0, dtype=np.int64)
        self.tbs_per_gpu = [len(g.tbs) for g in program.gpus]
        per_tb = np.fromiter(map(len, (tb.steps for tb in tbs)), np.int64, len(tbs))
        self.tb_start = (np.cumsum(per_tb) - per_tb).tolist()
        step_halves = list(map(_step_halves, chain.from_iterable(tb.steps for tb in tbs)))
        self.steps = len(step_halves)
        self.tb_of_step = np.repeat(np.arange(len(tbs), dtype=np.int64), per_tb)
        starts = np.asarray(self.tb_start, dtype=np.int64)
        self.index = np.arange(self.steps, dtype=np.int64) - np.repeat(starts, per_tb)
        counts = np.fromiter(map(len, step_halves), np.int64, self.steps)
        flat = np.fromiter(chain.from_iterable(step_halves), np.int64, int(counts.sum()))
        self.step_of_half = np.full(len(program.halves), -1, dtype=np.int64)
        self.step_of_half[flat] = np.repeat(np.arange(self.steps, dtype=np.int64), counts)
        first = flat[np.cumsum(counts) - counts] if self.steps else flat
        self.first_half = first
        self.place = program.places_array()[first]
        self.touched: list[bool] = []

    def tbs_with_reductions(self, program: Program) -> set[int]:
        """Threadblocks with two or more local reductions (see _keep_reductions_apart)."""
        kinds = program.halves.kind[self.first_half] if hasattr(program.halves, "kind") else np.array(
            [HALF_KINDS.index(program.halves[h].kind) for h in self.first_half.tolist()], dtype=np.int64)
        reduce_tbs = self.tb_of_step[kinds == HALF_KINDS.index(HalfKind.REDUCE)]
        tbs, counts = np.unique(reduce_tbs, return_counts=True)
        return set(tbs[counts > 1].tolist())


class _Needs(NamedTuple):
    """The steps (global numbers) that must follow a step of another threadblock, in
    order, and for each, per such threadblock (in threadblock order) the last of its
    steps it must follow (global number): `targets[bounds[k]:bounds[k + 1]]` for
    `steps[k]`. Arrays: a million steps at 1,024 GPUs, which as a dict of dicts took
    300 MiB."""

    steps: np.ndarray
    bounds: np.ndarray
    targets: np.ndarray


def _cross_needs(program: Program, layout: _Layout) -> _Needs:
    """What each step must follow in other threadblocks (from the halves'
    predecessors); only such steps can be waited for."""
    half, pred = program.predecessor_pairs()
    hs, ps = layout.step_of_half[half], layout.step_of_half[pred]
    th, tp = layout.tb_of_step[hs], layout.tb_of_step[ps]
    same = th == tp
    later = same & (layout.index[ps] > layout.index[hs])
    if later.any():
        k = int(np.flatnonzero(later)[0])
        t = int(th[k])
        raise RuntimeError(f"GPU {int(layout.gpu_of_tb[t])} tb {int(layout.local_tb[t])} step "
                           f"{int(layout.index[hs[k]])} would wait for its own later step {int(layout.index[ps[k]])}")
    cross = ~same
    hs, tp, pi = hs[cross], tp[cross], layout.index[ps[cross]]
    if not len(hs):
        empty = np.zeros(0, dtype=np.int64)
        return _Needs(empty, np.zeros(1, dtype=np.int64), empty)
    order = np.lexsort((pi, tp, hs))
    hs, tp, pi = hs[order], tp[order], pi[order]
    last = np.r_[(hs[1:] != hs[:-1]) | (tp[1:] != tp[:-1]), True]  # the largest index of each (step, tb)
    hs, tp, pi = hs[last], tp[last], pi[last]
    starts = np.flatnonzero(np.r_[True, hs[1:] != hs[:-1]])
    return _Needs(hs[starts], np.r_[starts, len(hs)], np.asarray(layout.tb_start, dtype=np.int64)[tp] + pi)


class _Limit(Enum):
    """How a placement measured against max_steps can be given up early."""

    NONE = "none"  # only once ordered in full: chaining may or may not take nops away
    NOPS = "nops"  # no GPU can pass the XML nodes: each wait's nops stay
    CHAINED = "chained"  # every placement chains its waits (some GPU passes the nodes without nops)


def _limit_kind(program: Program, layout: _Layout, needs: _Needs) -> _Limit:
    if _most_xml_nodes(program, layout, {}) > MAX_XML_NODES:
        return _Limit.CHAINED
    if _most_xml_nodes_bound(program, layout, needs) <= MAX_XML_NODES:
        return _Limit.NOPS
    return _Limit.NONE


def _waits(program: Program, layout: _Layout, needs: _Needs, max_steps: int | None = None,
           chained: bool = False) -> dict[int, list[int]] | None:
    """Per step (global number) that waits: the steps (global numbers) it waits for,
    in threadblock order, redundant waits dropped (see the module's docstring); None as
    soon as a threadblock's steps and the nops its waits add pass `max_steps` (None: no
    limit). `chained`: the waits are chained (`_chain_waits`) GPU by GPU as each is
    done (chaining reads and changes only one GPU's waits), and its threadblocks are
    measured then.

    What is known complete once a step is done: per threadblock of its GPU, its last
    step known done (-1: none); an array (a GPU may have a hundred threadblocks, and
    waits merge these), kept for the last step visited of each threadblock (`current`)
    and copied for each step that may be waited for (`kept`). A threadblock's own entry
    is read only through such copies, so it is set only there. Only steps that wait or
    may be waited for change what is known, so only those are visited, in order of
    place on each GPU."""
    may = np.zeros(layout.steps, dtype=bool)
    may[needs.targets] = True
    visit = np.union1d(needs.steps, np.flatnonzero(may))
    if not len(visit):
        return {}
    gpu = layout.gpu_of_tb[layout.tb_of_step[visit]]
    visit = visit[np.lexsort((layout.place[visit], gpu))]
    # Where each visited step's needs are (lo == hi: none).
    k = np.minimum(np.searchsorted(needs.steps, visit), max(0, len(needs.steps) - 1))
    has = needs.steps[k] == visit if len(needs.steps) else np.zeros(len(visit), dtype=bool)
    lo = np.where(has, needs.bounds[k], 0)
    hi = np.where(has, needs.bounds[np.minimum(k + 1, len(needs.bounds) - 1)], 0)
    # The loop reads single entries: of every step from machine-integer arrays (lists of
    # Python ints for two million steps took 250 MiB), of the visited steps in chunks.
    place, tb_of_step, index = (array("q", a.astype(np.int64).tobytes())
                                for a in (layout.place, layout.tb_of_step, layout.index))
    may_wait_for = bytes(may.view(np.uint8))
    targets_of = needs.targets.tolist()
    local, gpu_of_tb = layout.local_tb.tolist(), layout.gpu_of_tb.tolist()
    # Per threadblock, the nops it may still take within `max_steps`.
    room = (max_steps - np.diff(np.asarray([*layout.tb_start, layout.steps], dtype=np.int64))).tolist() \
        if max_steps is not None else None
    current: dict[int, np.ndarray] = {}
    kept: dict[int, np.ndarray] = {}
    waits: dict[int, list[int]] = {}
    gpu_waits: list[int] = []  # the steps of the GPU being visited that wait (chained)
    visiting = -1  # that GPU
    for s, a, b in _chunked(visit, lo, hi):
        t = tb_of_step[s]
        if chained and gpu_of_tb[t] != visiting:
            if room is not None and not _chained_fit(layout, waits, gpu_waits, room):
                return None
            gpu_waits, visiting = [], gpu_of_tb[t]
        known = current.get(t)
        if known is None:
            known = current[t] = np.full(layout.tbs_per_gpu[gpu_of_tb[t]], -1, dtype=np.int64)
        if a != b:
            at = place[s]
            mine: list[int] = []
            for target in sorted(targets_of[a:b], key=place.__getitem__, reverse=True):
                wt = tb_of_step[target]
                if known[local[wt]] >= index[target]:
                    continue
                if place[target] >= at:
                    raise RuntimeError(f"GPU {gpu_of_tb[t]} tb {local[t]} step {index[s]} would wait for a later "
                                       "step")
                mine.append(target)
                known = np.maximum(known, kept[target])
            if mine:
                mine.sort(key=lambda w: (local[tb_of_step[w]], index[w]))
                waits[s] = mine
                current[t] = known
                if chained:
                    gpu_waits.append(s)
                elif room is not None:
                    room[t] -= len(mine) - 1
                    if room[t] < 0:
                        return None
        if may_wait_for[s]:
            known[local[t]] = index[s]
            kept[s] = known.copy()
    if chained:
        if room is None:
            _chain_steps(layout, waits, sorted(waits))
        elif not _chained_fit(layout, waits, gpu_waits, room):
            return None
    touched = [False] * len(layout.tb_start)
    for s, ws in waits.items():
        touched[tb_of_step[s]] = True
        for w in ws:
            touched[tb_of_step[w]] = True
    layout.touched = touched
    return waits


def _most_xml_nodes(program: Program, layout: _Layout, waits: dict[int, list[int]]) -> int:
    """XML nodes of the GPU with the most: `<algo>`, every `<gpu>`, its `<tb>`s, steps
    and nop steps."""
    per_gpu = np.bincount(layout.gpu_of_tb[layout.tb_of_step], minlength=len(program.gpus))
    per_gpu += np.asarray(layout.tbs_per_gpu, dtype=np.int64)
    for s, ws in waits.items():
        per_gpu[layout.gpu_of_tb[layout.tb_of_step[s]]] += len(ws) - 1
    return 1 + len(program.gpus) + int(per_gpu.max(initial=0))


def _most_xml_nodes_bound(program: Program, layout: _Layout, needs: _Needs) -> int:
    """At least `_most_xml_nodes` of any waits `_waits` can decide: each step that must
    follow steps of k other threadblocks waits for at most k of them."""
    per_gpu = np.bincount(layout.gpu_of_tb[layout.tb_of_step], minlength=len(program.gpus))
    per_gpu += np.asarray(layout.tbs_per_gpu, dtype=np.int64)
    if len(needs.steps):
        nops = np.diff(needs.bounds) - 1
        per_gpu += np.bincount(layout.gpu_of_tb[layout.tb_of_step[needs.steps]], weights=nops,
                               minlength=len(program.gpus)).astype(np.int64)
    return 1 + len(program.gpus) + int(per_gpu.max(initial=0))


def _chained_fit(layout: _Layout, waits: dict[int, list[int]], steps: list[int], room: list[int]) -> bool:
    """Chain the waits of one GPU's `steps` (all its steps that wait, in place order)
    and take the nops left from its threadblocks' `room`: whether all stay within it."""
    steps.sort()
    _chain_steps(layout, waits, steps)
    tb_of_step = layout.tb_of_step
    for s in steps:
        extra = len(waits[s]) - 1
        if extra:
            t = int(tb_of_step[s])
            room[t] -= extra
            if room[t] < 0:
                return False
    return True


def _chain_waits(layout: _Layout, waits: dict[int, list[int]]) -> None:
    """Where a GPU would pass the executor's XML nodes: a step that waits for several
    threadblocks (one nop step per extra wait) waits for the latest of those steps only,
    and each of them, where it waits for nothing itself, waits for the one before it in
    place order: the same steps are known done before the step runs, without nops.

    A joined transfer of relayed blocks (`msccl-coalesce`) waits for the receives of
    each of them, one per peer of the node: 6 nop steps for 7 blocks. Chained, the
    receives complete in place order, which is about the order their messages arrive.
    Every added wait points to an earlier place, so the module's argument against
    deadlock holds."""
    for cur in _chain_steps(layout, waits, sorted(waits)):
        layout.touched[int(layout.tb_of_step[cur])] = True


def _chain_steps(layout: _Layout, waits: dict[int, list[int]], steps: list[int]) -> list[int]:
    """`_chain_waits` of the waits of `steps` (sorted); returns the steps that wait now
    and did not."""
    place, tb_of_step = layout.place, layout.tb_of_step
    added: list[int] = []
    for s in steps:
        ws = waits[s]
        if len(ws) < 2:
            continue
        ordered = sorted(ws, key=lambda w: int(place[w]))
        keep = [ordered[-1]]
        cur = ordered[-1]
        for w in reversed(ordered[:-1]):
            if cur not in waits:
                waits[cur] = [w]
                added.append(cur)
                cur = w
            else:
                keep.append(w)
        keep.sort(key=lambda w: (int(layout.local_tb[tb_of_step[w]]), int(layout.index[w])))
        waits[s] = keep
    return added


def _chunked(*columns: np.ndarray, size: int = 1 << 16) -> Iterator[tuple[int, ...]]:
    """The rows of equally long integer arrays as tuples of Python ints, converted a
    chunk at a time."""
    for lo in range(0, len(columns[0]), size):
        yield from zip(*(c[lo:lo + size].tolist() for c in columns))


def _numbers(layout: _Layout, waits: dict[int, list[int]]) -> Callable[[int], int]:
    """The step number (`s`, nops included) of a step given by its global number: its
    index plus the nops that the waits of its threadblock's earlier steps (and its
    own) add."""
    extra: dict[int, list[tuple[int, int]]] = {}  # tb -> (index, nops up to it), in order
    for s in sorted(waits):
        t = int(layout.tb_of_step[s])
        rows = extra.setdefault(t, [])
        rows.append((int(layout.index[s]), (rows[-1][1] if rows else 0) + len(waits[s]) - 1))

    def number(s: int) -> int:
        i = int(layout.index[s])
        rows = extra.get(int(layout.tb_of_step[s]))
        if not rows:
            return i
        k = bisect.bisect_right(rows, (i, _INT64_MAX)) - 1
        return i + (rows[k][1] if k >= 0 else 0)

    return number


def _numbered_steps(tb: LThreadblock, first: int, waits: dict[int, list[int]], targets: set[int],
                    number: Callable[[int], int], layout: _Layout) -> tuple[LStep, ...]:
    """The threadblock's steps with their waits, nops and hasdep flags (`first`: the
    global number of its first step)."""
    local, tb_of_step = layout.local_tb, layout.tb_of_step
    steps: list[LStep] = []
    for i, step in enumerate(tb.steps):
        s = first + i
        ws = waits.get(s)
        waited_for = s in targets
        if ws is None and not waited_for and step.wait is None and not step.hasdep:
            steps.append(step)  # most steps: nothing to add
            continue
        if ws is None:
            steps.append(make_step(step.type, step.halves, None, waited_for))
            continue
        for w in ws[:-1]:
            steps.append(make_step(StepType.NOP, (), (int(local[tb_of_step[w]]), number(w))))
        w = ws[-1]
        steps.append(make_step(step.type, step.halves, (int(local[tb_of_step[w]]), number(w)), waited_for))
    return tuple(steps)


def _keep_reductions_apart(steps: tuple[LStep, ...], program: Program) -> tuple[LStep, ...]:
    """The executor fuses consecutive `re` steps with the same destination and source
    buffer into one transmission, taking the last step's `cnt` for all of them; where the
    counts differ, `hasdep` on the earlier step (which only publishes progress) keeps
    them apart."""
    out = list(steps)
    for k in range(1, len(out)):
        prev, cur = out[k - 1], out[k]
        if prev.type is not StepType.REDUCE or cur.type is not StepType.REDUCE or cur.wait is not None:
            continue
        a, b = program.halves[prev.halves[0]], program.halves[cur.halves[0]]
        if (a.dst, a.src.buffer) == (b.dst, b.src.buffer) and a.count != b.count and not prev.hasdep:
            out[k - 1] = prev._replace(hasdep=True)
    return tuple(out)


@register_pass
@dataclass(frozen=True)
class OrderSteps(Pass):
    name = "msccl-deps"
    summary = "number MSCCL steps and express cross-threadblock dependencies (depid/deps/hasdep, nop steps)"

    @collections_paused
    def run(self, unit: CompileUnit) -> CompileUnit:
        if not isinstance(unit.lowered, Program):
            raise CollcError(f"{self.name} needs the MSCCL lowered program; run msccl-threadblocks before it")
        ordered = order_steps(unit.lowered)
        nops = sum(1 for g in ordered.gpus for tb in g.tbs for s in tb.steps if s.type is StepType.NOP)
        deps = sum(1 for g in ordered.gpus for tb in g.tbs for s in tb.steps if s.wait is not None)
        return replace(unit, lowered=ordered).with_note(self.name, dependencies=deps, nops=nops)

