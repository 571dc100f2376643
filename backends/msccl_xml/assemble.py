"""`msccl-assemble`: the ordered lowered program as an `XmlAlgo` (the writer's input).

Operands follow what the executor reads for each step type (msccl_kernel.cu):

| type | executor uses | written here |
|---|---|---|
| s | src (local) | src local, dst = where the receiver stores it |
| r | dst (local) | src = where the sender reads it, dst local |
| rcs | dst (store, then forward) | src = where the sender reads it, dst local |
| rrc, rrcs | dst = received + src | src = dst (reductions are in place) |
| rrs | received + src, sent on | src = dst |

A receive names the matching send's source in `srcbuf`/`srcoff`, as MSCCLang, SCCL and
RCCL files do (third-party checkers pair sends and receives by it). For `r` and `rcs`
the executor ignores src, so this costs nothing. For `rrc`, `rrs` and `rrcs` it reads
src as the local operand of the reduction, so src must stay the local slot; MSCCLang's
files agree there only because its reductions always add a chunk into the same slot it
left the sender from (the same buffer and offset on both ranks).

| cpy, re | src and dst (local) | as is |
| nop | nothing | srcbuf i, dstbuf o, offsets -1, cnt 0 (the parser still reads them) |
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

import numpy as np

from collc.backends.msccl_xml.model import BufferName, Protocol, StepType, XmlAlgo, XmlGpu, XmlStep, XmlThreadblock
from collc.backends.msccl_xml.program import ROOTED, LStep, Program, Stage, collections_paused
from collc.diagnostics import CollcError
from collc.passes.base import CompileUnit, Pass, register_pass


def assemble(program: Program, *, proto: Protocol = Protocol.SIMPLE, min_bytes: int = 0, max_bytes: int = 0,
             name: str = "") -> XmlAlgo:
    if program.stage is not Stage.ORDERED:
        raise CollcError(f"msccl-assemble needs numbered steps; run msccl-deps before it (the program is "
                         f"{program.stage.value})")
    if min_bytes < 0 or max_bytes < 0:
        raise CollcError(f"msccl-assemble: byte range [{min_bytes}, {max_bytes}] is negative")
    if max_bytes and max_bytes < min_bytes:
        raise CollcError(f"msccl-assemble: maxBytes={max_bytes} is below minBytes={min_bytes}; no message size "
                         "would select the file (maxBytes=0 means no upper limit)")
    gpus = []
    operands = _Operands(program)
    for g in program.gpus:
        tbs = [XmlThreadblock(tb.id, tb.send, tb.recv, tb.chan, _steps(tb.steps, operands)) for tb in g.tbs]
        gpus.append(XmlGpu(g.rank, g.i_chunks, g.o_chunks, g.s_chunks, tbs))
    extra = {}
    if program.collective.kind in ROOTED:
        # Not read by the executor; tells `collc verify` (and a reader) which rank is the root.
        extra["root"] = str(program.collective.root or 0)
    return XmlAlgo(
        name=algo_name(name or program.name, program), proto=Protocol(proto), nchannels=program.nchannels,
        nchunksperloop=program.nchunksperloop, ngpus=program.ngpus, coll=program.coll, inplace=program.inplace,
        outofplace=not program.inplace, min_bytes=min_bytes, max_bytes=max_bytes, gpus=gpus, extra_attrs=extra)


def algo_name(base: str, program: Program) -> str:
    """A name the executor's parser reads intact: no quotes or spaces, under 255 bytes."""
    text = re.sub(r"[^A-Za-z0-9_.+-]+", "_", base).strip("_") or program.coll
    return text[:120]


# Step types written with their first half's own src and dst (for r and rcs the first
# half is the receive: its src is where the sender reads). rrc, rrs and rrcs: the executor
# adds src (local) into what arrives, in place on dst, so src is dst. A frozenset: a
# tuple test compares str-enum members with == one by one (Python code).
_OWN_OPERANDS = frozenset((StepType.SEND, StepType.RECV, StepType.RECV_COPY_SEND, StepType.COPY, StepType.REDUCE))


class _Operands:
    """Per step of the program, in order (gpu, threadblock, step), the operands of its
    first half: found for all steps at once from the half columns, then handed out one
    by one as `_steps` writes them."""

    def __init__(self, program: Program):
        halves = program.halves
        first = np.fromiter((step.halves[0] if step.halves else 0 for g in program.gpus for tb in g.tbs
                             for step in tb.steps), np.int64)
        names = (BufferName.INPUT, BufferName.OUTPUT, BufferName.SCRATCH)
        self.rows = zip(map(names.__getitem__, halves.src_buffer[first].tolist()), halves.src_index[first].tolist(),
                        map(names.__getitem__, halves.dst_buffer[first].tolist()), halves.dst_index[first].tolist(),
                        halves.count[first].tolist())


def _steps(steps: tuple[LStep, ...], operands: _Operands) -> list[XmlStep]:
    """The XML steps of a threadblock (one loop: it runs once per step)."""
    out = []
    nop, own = StepType.NOP, _OWN_OPERANDS
    rows = operands.rows
    for s, (step, (sb, si, db, di, count)) in enumerate(zip(steps, rows)):
        kind = step.type
        depid, deps = step.wait if step.wait is not None else (-1, -1)
        if kind is nop:
            out.append(XmlStep(s, nop, BufferName.INPUT, -1, BufferName.OUTPUT, -1, 0, depid, deps, False))
        elif kind in own:
            out.append(XmlStep(s, kind, sb, si, db, di, count, depid, deps, step.hasdep))
        else:
            out.append(XmlStep(s, kind, db, di, db, di, count, depid, deps, step.hasdep))
    return out


@register_pass
@dataclass(frozen=True)
class AssembleAlgo(Pass):
    name = "msccl-assemble"
    summary = "build the MSCCL XML program (XmlAlgo) from the ordered threadblocks"
    proto: Protocol = Protocol.SIMPLE
    min_bytes: int = 0
    max_bytes: int = 0  # 0: no upper limit

    @collections_paused
    def run(self, unit: CompileUnit) -> CompileUnit:
        if not isinstance(unit.lowered, Program):
            raise CollcError(f"{self.name} needs the MSCCL lowered program; run msccl-threadblocks, msccl-fuse "
                             "and msccl-deps before it")
        algo = assemble(unit.lowered, proto=self.proto, min_bytes=self.min_bytes, max_bytes=self.max_bytes)
        return replace(unit, lowered=algo).with_note(self.name, gpus=algo.ngpus, channels=algo.nchannels,
                                                     steps=sum(len(tb.steps) for g in algo.gpus for tb in g.tbs))
