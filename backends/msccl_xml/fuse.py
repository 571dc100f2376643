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
from collections.abc import Iterable
from dataclasses import dataclass, replace
from itertools import chain, compress, repeat
from operator import itemgetter

import numpy as np

from collc.backends.msccl_xml.channels import fusion_candidates
from collc.backends.msccl_xml.model import StepType
from collc.backends.msccl_xml.program import (
    HALF_KINDS, HalfKind, IntPairs, LStep, LThreadblock, Program, Stage, collections_paused, remember_last,
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
    # Every step of every threadblock in one list (C-level iteration: four million steps
    # at 1,024 GPUs), and its half.
    flat = list(chain.from_iterable(tb.steps for tb in tbs))
    first = np.fromiter(map(_first_half, map(_step_halves, flat)), np.int64, len(flat))
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
    pa, pb = place[ca], place[cb]
    pair_bounds = np.searchsorted(t, np.arange(len(tbs) + 1)).tolist()
    # Places of each threadblock's sends, sorted.
    sent = first[halves.kind[first] == HALF_KINDS.index(HalfKind.SEND)]
    sent_places = place[sent]
    sent_owner = owner[sent]
    order = np.lexsort((sent_places, sent_owner))
    bounds = np.searchsorted(sent_owner[order], np.arange(len(tbs) + 1)).tolist()
    sorted_places = sent_places[order]
    # Lists of Python ints one threadblock at a time (for all of them at once, two
    # million candidates as tuples took 450 MiB).
    chosen = np.zeros(len(ca), dtype=bool)
    for k in np.flatnonzero(np.diff(pair_bounds)).tolist():
        lo, hi = pair_bounds[k], pair_bounds[k + 1]
        pairs = zip(pa[lo:hi].tolist(), pb[lo:hi].tolist(), ca[lo:hi].tolist(), cb[lo:hi].tolist())
        chosen[lo + np.array(_choose(pairs, sorted_places[bounds[k]:bounds[k + 1]].tolist()), dtype=np.int64)] = True
    gpus = _fused_gpus(program, tbs, flat, first, lengths, owner, ca[chosen], cb[chosen])
    return replace(program, gpus=gpus, stage=Stage.FUSED)


_step_halves = itemgetter(1)  # LStep.halves, read at C level
_first_half = itemgetter(0)


def _choose(pairs: Iterable[tuple[int, int, int, int]], send_places: list[int]) -> list[int]:
    """The candidates of one threadblock that fuse, as positions in `pairs`.

    `pairs`: (place of a, place of b, receive a, send b) of the candidates inside the
    threadblock whose send waits for nothing at or after its receive, sorted: receives
    in key order, each receive's sends in key order.
    `send_places`: the places of the threadblock's sends, sorted. They are in message
    order too (all go to the one send peer on the one channel), and fusing keeps them so."""
    partner: set[int] = set()  # receives fused
    fused_sends: set[int] = set()
    chosen: list[int] = []
    bisect_right = bisect.bisect_right
    for k, (at, bt, a, b) in enumerate(pairs):
        if a in partner or b in fused_sends:
            continue
        # The send moves from its own place back to a's. A send placed in between
        # carries an earlier message than b's and would then leave after it.
        lo = bisect_right(send_places, at)
        if send_places[lo] != bt:
            continue
        partner.add(a)
        fused_sends.add(b)
        chosen.append(k)
        send_places[lo] = at  # b's place moves to a's: no send lies between them
    return chosen


def _fused_gpus(program: Program, tbs: list[LThreadblock], flat: list[LStep], first: np.ndarray,
                lengths: np.ndarray, owner: np.ndarray, a: np.ndarray, b: np.ndarray) -> tuple:
    """The GPUs with the step of every receive a[k] replaced by it fused with send b[k]
    (at the receive's place) and the send's step dropped; a threadblock where nothing
    fused is kept as it is. `flat`: all steps, threadblock after threadblock; `first`:
    the half of each."""
    at = np.empty(len(program.halves), dtype=np.int64)  # half -> its step in `flat`
    at[first] = np.arange(len(first), dtype=np.int64)
    for p, step in zip(at[a].tolist(), _fused_steps(program, a, b)):
        flat[p] = step
    keep = np.ones(len(flat), dtype=bool)
    keep[at[b]] = False
    kept = list(compress(flat, keep.tolist()))
    fused_in = np.bincount(owner[a], minlength=len(tbs))
    new_lengths = (lengths - np.bincount(owner[b], minlength=len(tbs))).tolist()
    starts = (np.cumsum(new_lengths) - new_lengths).tolist()
    changed = (fused_in > 0).tolist()
    out = iter([LThreadblock(tb.id, tb.send, tb.recv, tb.chan, tuple(kept[lo:lo + n])) if ch else tb
                for tb, ch, lo, n in zip(tbs, changed, starts, new_lengths)])
    return tuple(replace(g, tbs=tuple(next(out) for _ in g.tbs)) for g in program.gpus)


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


_FUSED_TYPES = (StepType.RECV_COPY_SEND, StepType.RECV_REDUCE_SEND, StepType.RECV_REDUCE_COPY_SEND)


def _fused_steps(program: Program, a: np.ndarray, b: np.ndarray) -> list[LStep]:
    """The step of each receive a[k] fused with send b[k]: `rcs` after a plain receive;
    after a receive-reduce `rrs` where b is the only reader of the sum, else `rrcs`
    (built at C level: two million at 1,024 GPUs)."""
    sole = _sole_reader_of(program)
    code = np.where(program.halves.kind[a] == _RECV, 0, np.where(sole[a] == b, 1, 2))
    types = map(_FUSED_TYPES.__getitem__, code.tolist())
    rows = zip(types, zip(a.tolist(), b.tolist()), repeat(None), repeat(False))
    return list(map(tuple.__new__, repeat(LStep), rows))


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
