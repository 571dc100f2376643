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

from dataclasses import dataclass, replace

import numpy as np

from collc.backends.msccl_xml.model import StepType
from collc.backends.msccl_xml.program import (
    LGpu, LStep, LThreadblock, Program, Stage, collections_paused, make_step, remember_last,
)
from collc.diagnostics import CollcError
from collc.passes.base import CompileUnit, Pass, register_pass


@remember_last
def order_steps(program: Program) -> Program:
    if program.stage is Stage.ORDERED:
        raise CollcError("msccl-deps has already run on this program")
    # Threadblock ids are positions in each GPU's list (msccl-threadblocks numbers them so).
    gpus = tuple(_order_gpu(g, program) for g in program.gpus)
    return replace(program, gpus=gpus, stage=Stage.ORDERED)


def _order_gpu(gpu: LGpu, program: Program) -> LGpu:
    preds, key_place = program.preds, program.key_places()
    ntbs = len(gpu.tbs)
    owner: dict[int, tuple[int, int]] = {}
    place: dict[tuple[int, int], int] = {}  # step -> the integer place of its first half's key
    # (place, tb, step index, halves) of every step, to visit in order of place.
    visits: list[tuple[int, int, int, tuple[int, ...]]] = []
    for t, tb in enumerate(gpu.tbs):
        for i, step in enumerate(tb.steps):
            hs = step.halves
            for h in hs:
                owner[h] = (t, i)
            at = key_place[hs[0]]
            place[(t, i)] = at
            visits.append((at, t, i, hs))
    visits.sort()  # places are distinct

    # Per step (visited), the last step of each other threadblock it must follow (from
    # the halves' predecessors); only those steps can be waited for. Most steps follow
    # only their own threadblock: they get no entry.
    needs: dict[int, dict[int, int]] = {}
    for k, (at, t, i, hs) in enumerate(visits):
        needed: dict[int, int] | None = None
        for h in hs:
            for p in preds[h]:
                pt, pi = owner[p]
                if pt == t:
                    if pi > i:
                        raise RuntimeError(f"GPU {gpu.rank} tb {t} step {i} would wait for its own later step {pi}")
                    continue
                if needed is None:
                    needed = {pt: pi}
                elif needed.get(pt, -1) < pi:
                    needed[pt] = pi
        if needed is not None:
            needs[k] = needed
    may_wait_for = {target for needed in needs.values() for target in needed.items()}

    # What is known complete once a step is done: per threadblock, its last step known
    # done (-1: none); an array (a GPU may have a hundred threadblocks, and waits merge
    # these). `current` holds it for the last step visited of each threadblock (what its
    # next step starts from); `kept`, a copy for each step that may be waited for. A
    # threadblock's own entry is read only through such copies, so it is set only there.
    current = list(np.full((ntbs, ntbs), -1, dtype=np.int64))
    kept: dict[tuple[int, int], np.ndarray] = {}
    waits: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for k, (at, t, i, _) in enumerate(visits):
        needed = needs.get(k)
        if needed is not None:
            known = current[t]
            mine: list[tuple[int, int]] = []
            for target in sorted(needed.items(), key=place.__getitem__, reverse=True):
                wt, wi = target
                if known[wt] >= wi:
                    continue
                if place[target] >= at:
                    raise RuntimeError(f"GPU {gpu.rank} tb {t} step {i} would wait for a later step")
                mine.append(target)
                known = np.maximum(known, kept[target])
            if mine:
                mine.sort()
                waits[(t, i)] = mine
                current[t] = known
        if (t, i) in may_wait_for:
            known = current[t]
            known[t] = i
            kept[(t, i)] = known.copy()

    # Number the steps (nops included), then write the waits with those numbers.
    number: dict[tuple[int, int], int] = {}
    for t, tb in enumerate(gpu.tbs):
        s = 0
        for i in range(len(tb.steps)):
            ws = waits.get((t, i))
            if ws is not None:
                s += len(ws) - 1
            number[(t, i)] = s
            s += 1
    targets = {target for ws in waits.values() for target in ws}
    tbs = []
    for t, tb in enumerate(gpu.tbs):
        steps: list[LStep] = []
        for i, step in enumerate(tb.steps):
            ws = waits.get((t, i))
            waited_for = (t, i) in targets
            if ws is None and not waited_for and step.wait is None and not step.hasdep:
                steps.append(step)  # most steps: nothing to add
                continue
            if ws is None:
                steps.append(make_step(step.type, step.halves, None, waited_for))
                continue
            for wt, wi in ws[:-1]:
                steps.append(make_step(StepType.NOP, (), (wt, number[(wt, wi)])))
            steps.append(make_step(step.type, step.halves, (ws[-1][0], number[ws[-1]]), waited_for))
        tbs.append(LThreadblock(tb.id, tb.send, tb.recv, tb.chan, _keep_reductions_apart(tuple(steps), program)))
    return replace(gpu, tbs=tuple(tbs))


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

