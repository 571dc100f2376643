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

from collc.backends.msccl_xml.channels import fusion_candidates
from collc.backends.msccl_xml.model import StepType
from collc.backends.msccl_xml.program import (
    Half, HalfKind, LThreadblock, Program, Stage, make_step, remember_last,
)
from collc.diagnostics import CollcError
from collc.passes.base import CompileUnit, Pass, register_pass


@remember_last
def fuse(program: Program) -> Program:
    if program.stage is not Stage.ASSIGNED:
        raise CollcError(f"msccl-fuse runs right after msccl-threadblocks (the program is {program.stage.value})")
    forwards: dict[int, list[int]] = defaultdict(list)  # receive half -> sends that forward it
    candidates = program.candidates
    if candidates is None:
        candidates = fusion_candidates(program.halves, program.preds)
    for a, b in candidates:
        forwards[a].append(b)
    sole = dict(program.sole_readers)
    gpus = tuple(replace(g, tbs=tuple(_fuse_tb(tb, program, forwards, sole) for tb in g.tbs)) for g in program.gpus)
    return replace(program, gpus=gpus, stage=Stage.FUSED)


def _fuse_tb(tb: LThreadblock, program: Program, forwards: dict[int, list[int]], sole: dict[int, int]
             ) -> LThreadblock:
    halves, preds = program.halves, program.preds
    place = program.key_places()  # integer ranks of the halves' keys
    send = HalfKind.SEND
    order = [s.halves[0] for s in tb.steps]  # one half per step so far, in key order
    in_tb = set(order)
    # Places of the threadblock's sends, sorted. They are in message order too (all go to
    # the one send peer on the one channel), and fusing keeps them so.
    send_places = sorted(place[h] for h in order if halves[h].kind is send)
    partner: dict[int, int] = {}  # receive -> fused send
    fused_sends: set[int] = set()
    for a in order:
        sends = forwards.get(a)
        if not sends or not halves[a].kind.receives:
            continue
        if len(sends) > 1:
            sends = sorted(sends, key=place.__getitem__)
        at = place[a]
        for b in sends:
            if b not in in_tb or b in fused_sends:
                continue
            # The fused step runs at a's place: b may wait for nothing at or after it.
            if any(p != a and place[p] >= at for p in preds[b]):
                continue
            # The send moves from its own place back to a's. A send placed in between
            # carries an earlier message than b's and would then leave after it.
            bt = place[b]
            lo = bisect.bisect_right(send_places, at)
            if send_places[lo] != bt:
                continue
            partner[a] = b
            fused_sends.add(b)
            del send_places[lo]  # b's place: no send lies between at and it
            send_places.insert(lo, at)
            break
    if not partner:  # nothing fused: the steps stay as they are
        return tb
    steps = []
    for step, h in zip(tb.steps, order):
        if h in fused_sends:
            continue
        b = partner.get(h)
        steps.append(step if b is None else make_step(_fused_type(halves[h], b, sole), (h, b)))
    return LThreadblock(tb.id, tb.send, tb.recv, tb.chan, tuple(steps))


def _fused_type(receive: Half, send: int, sole: dict[int, int]) -> StepType:
    if receive.kind is HalfKind.RECV:
        return StepType.RECV_COPY_SEND
    return StepType.RECV_REDUCE_SEND if sole.get(receive.id) == send else StepType.RECV_REDUCE_COPY_SEND


@register_pass
@dataclass(frozen=True)
class FuseSteps(Pass):
    name = "msccl-fuse"
    summary = "fuse a receive with the send that forwards it (rcs, rrs, rrcs)"

    def run(self, unit: CompileUnit) -> CompileUnit:
        program = _program(unit, self.name)
        fused = fuse(program)
        count = sum(1 for g in fused.gpus for tb in g.tbs for s in tb.steps if len(s.halves) == 2)
        return replace(unit, lowered=fused).with_note(self.name, fused=count)


def _program(unit: CompileUnit, name: str) -> Program:
    if not isinstance(unit.lowered, Program):
        raise CollcError(f"{name} needs the MSCCL lowered program; run msccl-threadblocks before it")
    return unit.lowered
