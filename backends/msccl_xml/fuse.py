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
from dataclasses import dataclass, replace

import numpy as np

from collc.backends.msccl_xml.channels import fusion_candidates
from collc.backends.msccl_xml.model import StepType
from collc.backends.msccl_xml.program import (
    HALF_KINDS, HalfKind, IntPairs, LThreadblock, Program, Stage, collections_paused, make_step, remember_last,
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
    # Only a candidate whose receive and send share a threadblock, and whose send waits
    # for nothing at or after its receive (other than the receive), can fuse: group
    # those by threadblock (each step holds one half at this stage), receives in key
    # order and the sends of each receive in key order.
    halves = program.halves
    tbs = [tb for g in program.gpus for tb in g.tbs]
    first = np.fromiter((step.halves[0] for tb in tbs for step in tb.steps), np.int64)
    lengths = np.fromiter(map(len, (tb.steps for tb in tbs)), np.int64, len(tbs))
    owner = np.full(len(halves), -1, dtype=np.int64)
    owner[first] = np.repeat(np.arange(len(tbs), dtype=np.int64), lengths)
    place = program.places_array()
    ca, cb = program.candidate_pairs(candidates)
    keep = (owner[ca] >= 0) & (owner[ca] == owner[cb]) & _waits_before_receive(program, ca, cb, place)
    ca, cb = ca[keep], cb[keep]
    t = owner[ca]
    order = np.lexsort((place[cb], place[ca], t))
    t, ca, cb = t[order], ca[order], cb[order]
    pairs = list(zip(place[ca].tolist(), place[cb].tolist(), ca.tolist(), cb.tolist()))
    pair_bounds = np.searchsorted(t, np.arange(len(tbs) + 1)).tolist()
    # Places of each threadblock's sends, sorted.
    sent = first[halves.kind[first] == HALF_KINDS.index(HalfKind.SEND)]
    sent_places = place[sent]
    sent_owner = owner[sent]
    order = np.lexsort((sent_places, sent_owner))
    bounds = np.searchsorted(sent_owner[order], np.arange(len(tbs) + 1)).tolist()
    sorted_places = sent_places[order].tolist()
    sole = _sole_reader_of(program)
    fused_tbs = iter([_fuse_tb(tb, program, pairs[pair_bounds[k]:pair_bounds[k + 1]], sole,
                               sorted_places[bounds[k]:bounds[k + 1]])
                      if pair_bounds[k] != pair_bounds[k + 1] else tb for k, tb in enumerate(tbs)])
    gpus = tuple(replace(g, tbs=tuple(next(fused_tbs) for _ in g.tbs)) for g in program.gpus)
    return replace(program, gpus=gpus, stage=Stage.FUSED)


def _sole_reader_of(program: Program) -> np.ndarray:
    """Per half, the only half that reads the sum it stores (`Program.sole_readers`), -1
    where there is none: an array rather than a dict (a million entries at 1,024 GPUs)."""
    sole = np.full(len(program.halves), -1, dtype=np.int64)
    pairs = program.sole_readers
    if isinstance(pairs, IntPairs):
        sole[pairs.first] = pairs.second
    elif pairs:
        table = np.array(pairs, dtype=np.int64).reshape(len(pairs), 2)
        sole[table[:, 0]] = table[:, 1]
    return sole


def _fuse_tb(tb: LThreadblock, program: Program, pairs: list[tuple[int, int, int, int]], sole: np.ndarray,
             send_places: list[int]) -> LThreadblock:
    """`pairs`: (place of a, place of b, receive a, send b) of the candidates inside the
    threadblock whose send waits for nothing at or after its receive, sorted: receives
    in key order, each receive's sends in key order.
    `send_places`: the places of the threadblock's sends, sorted. They are in message
    order too (all go to the one send peer on the one channel), and fusing keeps them so."""
    kinds = program.halves.kind
    partner: dict[int, int] = {}  # receive -> fused send
    fused_sends: set[int] = set()
    bisect_right = bisect.bisect_right
    for at, bt, a, b in pairs:
        if a in partner or b in fused_sends:
            continue
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


def _waits_before_receive(program: Program, ca: np.ndarray, cb: np.ndarray, place: np.ndarray) -> np.ndarray:
    """Per candidate (receive a, send b): whether every half b must follow, other than
    a, comes before a (the fused step runs at a's place)."""
    half, pred = program.predecessor_pairs()
    ok = np.ones(len(ca), dtype=bool)
    if not len(ca):
        return ok
    # The candidates of each send, found by binary search on the sends sorted.
    by_send = np.argsort(cb, kind="stable")
    sends = cb[by_send]
    lo = np.searchsorted(sends, half, side="left")
    hi = np.searchsorted(sends, half, side="right")
    single = hi - lo == 1  # the usual case: the pair's half is the send of one candidate
    c = by_send[np.minimum(lo, len(sends) - 1)]
    bad = single & (pred != ca[c]) & (place[pred] >= place[ca[c]])
    ok[c[bad]] = False
    for k in np.flatnonzero(hi - lo > 1).tolist():  # a send in several candidates
        for j in by_send[lo[k]:hi[k]].tolist():
            if pred[k] != ca[j] and place[pred[k]] >= place[ca[j]]:
                ok[j] = False
    return ok


_RECV = HALF_KINDS.index(HalfKind.RECV)


def _fused_type(receive: int, kind: int, send: int, sole: np.ndarray) -> StepType:
    """The step a receive (of kind code `kind`) fused with `send` becomes (`sole`: see
    `_sole_reader_of`)."""
    if kind == _RECV:
        return StepType.RECV_COPY_SEND
    return StepType.RECV_REDUCE_SEND if sole.item(receive) == send else StepType.RECV_REDUCE_COPY_SEND


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
