"""`msccl-fuse`: a receive and the send that forwards it become one step.

`r` then `s` of the same chunk becomes `rcs` (receive, store, send on); `rrc` then `s`
becomes `rrcs`, or `rrs` when nothing else ever reads the stored sum (the executor then
does not store it). A fused step runs where its receive ran, so fusing is allowed only
when it keeps the two properties the threadblock order guarantees (see
`dependencies.py`):

- the step waits for nothing at or after its receive: every half the send must follow,
  other than the receive itself, comes earlier;
- the threadblock still sends in the order the receiving threadblock receives: no other
  send of the threadblock moves across the fused send.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from dataclasses import dataclass, replace

import numpy as np

from collc.backends.msccl_xml.channels import fusion_candidates
from collc.backends.msccl_xml.model import StepType
from collc.backends.msccl_xml.program import (
    HALF_KINDS, HalfKind, LThreadblock, Program, Stage, collections_paused, make_step, remember_last,
)
from collc.diagnostics import CollcError
from collc.passes.base import CompileUnit, Pass, register_pass


@remember_last
def fuse(program: Program) -> Program:
    if program.stage is not Stage.ASSIGNED:
        raise CollcError(f"msccl-fuse runs right after msccl-threadblocks (the program is {program.stage.value})")
    candidates = program.candidates
    if candidates is None:
        candidates = fusion_candidates(program.halves, program.preds)
    # Only a candidate whose receive and send share a threadblock can fuse: group those
    # by threadblock (each step holds one half at this stage), receives in key order and
    # the sends of each receive in key order.
    halves = program.halves
    tbs = [tb for g in program.gpus for tb in g.tbs]
    first = [step.halves[0] for tb in tbs for step in tb.steps]
    lengths = [len(tb.steps) for tb in tbs]
    owner_of = np.full(len(halves), -1, dtype=np.int64)
    owner_of[first] = np.repeat(np.arange(len(tbs), dtype=np.int64), lengths)
    owner = owner_of.tolist()
    place = program.key_places()
    inside: dict[int, list[tuple[int, int, int, int]]] = defaultdict(list)  # tb -> (place of a, of b, a, b)
    for a, b in candidates:
        t = owner[a]
        if t >= 0 and owner[b] == t:
            inside[t].append((place[a], place[b], a, b))
    # Places of each threadblock's sends, sorted.
    first_halves = np.asarray(first, dtype=np.int64)
    sent = first_halves[halves.kind[first_halves] == HALF_KINDS.index(HalfKind.SEND)]
    sent_places = np.asarray(place, dtype=np.int64)[sent]
    sent_owner = owner_of[sent]
    order = np.lexsort((sent_places, sent_owner))
    bounds = np.searchsorted(sent_owner[order], np.arange(len(tbs) + 1)).tolist()
    sorted_places = sent_places[order].tolist()
    sole = dict(program.sole_readers)
    fused_tbs = iter([_fuse_tb(tb, program, sorted(inside[t]), sole, sorted_places[bounds[t]:bounds[t + 1]])
                      if t in inside else tb for t, tb in enumerate(tbs)])
    gpus = tuple(replace(g, tbs=tuple(next(fused_tbs) for _ in g.tbs)) for g in program.gpus)
    return replace(program, gpus=gpus, stage=Stage.FUSED)


def _fuse_tb(tb: LThreadblock, program: Program, pairs: list[tuple[int, int, int, int]], sole: dict[int, int],
             send_places: list[int]) -> LThreadblock:
    """`pairs`: (place of a, place of b, receive a, send b) of the candidates inside the
    threadblock, sorted: receives in key order, each receive's sends in key order.
    `send_places`: the places of the threadblock's sends, sorted. They are in message
    order too (all go to the one send peer on the one channel), and fusing keeps them so."""
    kinds, preds = program.halves.kind, program.preds
    place = program.key_places()  # integer ranks of the halves' keys
    partner: dict[int, int] = {}  # receive -> fused send
    fused_sends: set[int] = set()
    bisect_right = bisect.bisect_right
    for at, bt, a, b in pairs:
        if a in partner or b in fused_sends:
            continue
        # The fused step runs at a's place: b may wait for nothing at or after it.
        for p in preds[b]:
            if p != a and place[p] >= at:
                break
        else:
            # The send moves from its own place back to a's. A send placed in between
            # carries an earlier message than b's and would then leave after it.
            lo = bisect_right(send_places, at)
            if send_places[lo] != bt:
                continue
            partner[a] = b
            fused_sends.add(b)
            send_places[lo] = at  # b's place moves to a's: no send lies between them
    if not partner:  # nothing fused: the steps stay as they are
        return tb
    steps = []
    get = partner.get
    for step in tb.steps:
        h = step.halves[0]
        b = get(h)
        if b is not None:
            steps.append(make_step(_fused_type(h, kinds.item(h), b, sole), (h, b)))
        elif h not in fused_sends:
            steps.append(step)
    return LThreadblock(tb.id, tb.send, tb.recv, tb.chan, tuple(steps))


_RECV = HALF_KINDS.index(HalfKind.RECV)


def _fused_type(receive: int, kind: int, send: int, sole: dict[int, int]) -> StepType:
    """The step a receive (of kind code `kind`) fused with `send` becomes."""
    if kind == _RECV:
        return StepType.RECV_COPY_SEND
    return StepType.RECV_REDUCE_SEND if sole.get(receive) == send else StepType.RECV_REDUCE_COPY_SEND


@register_pass
@dataclass(frozen=True)
class FuseSteps(Pass):
    name = "msccl-fuse"
    summary = "fuse a receive with the send that forwards it (rcs, rrs, rrcs)"

    @collections_paused
    def run(self, unit: CompileUnit) -> CompileUnit:
        program = _program(unit, self.name)
        fused = fuse(program)
        count = sum(1 for g in fused.gpus for tb in g.tbs for s in tb.steps if len(s.halves) == 2)
        return replace(unit, lowered=fused).with_note(self.name, fused=count)


def _program(unit: CompileUnit, name: str) -> Program:
    if not isinstance(unit.lowered, Program):
        raise CollcError(f"{name} needs the MSCCL lowered program; run msccl-threadblocks before it")
    return unit.lowered
