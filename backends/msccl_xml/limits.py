"""`msccl-limits`: the fixed-size tables of the MSCCL executor, checked before writing.

The executor's parser and kernel keep everything in arrays of fixed size; a file that
overflows one is rejected at load time (or worse, silently truncated). The limits, from
`msccl_struct.h` and `msccl_parser.h` of the current executor:

- at most 64 steps per threadblock (`MSCCL_MAX_NUM_STEPS`; the older runtime 256), and
  steps are numbered 0.. in document order;
- `cnt` below 72 (`MSCCL_MAX_COUNT`); offsets fit 16 bits;
- channels 0..31 (NCCL's `MAXCHANNELS`), at most 32 threadblocks per channel;
- dependencies name threadblocks 0..127 (`dependentBid` is 8 bits);
- at most 4096 XML nodes read per rank (`MSCCL_MAX_NODES`): `<algo>`, every `<gpu>`,
  and the rank's own `<tb>`s and `<step>`s (the parser skips other ranks' contents).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from collc.backends.msccl_xml.model import BufferName, StepType, XmlAlgo
from collc.backends.msccl_xml.program import collections_paused
from collc.diagnostics import CollcError
from collc.passes.base import CompileUnit, Pass, register_pass

MAX_STEPS = 64
MAX_COUNT = 72
MAX_CHANNELS = 32
MAX_TBS_PER_CHANNEL = 32
MAX_DEPENDENCY_TB = 127
MAX_XML_NODES = 4096
MAX_OFFSET = 2 ** 15 - 1


class LimitError(CollcError):
    """A program the MSCCL executor cannot load."""


class PeerLimitError(LimitError):
    """A GPU exchanges data with more peers than it can have threadblocks resident."""


# SMs left to other kernels (NCCL's own, the application's compute) that may hold an SM
# when the collective starts.
SM_HEADROOM = 2


def resident_threadblocks(sms: int) -> int:
    """Threadblocks per GPU a file may use on a GPU of `sms` SMs (AMD: compute units).

    The executor launches one block per threadblock and the blocks wait on each other
    (messages, dependencies), so every block of a GPU must be resident at once or the
    collective can deadlock. An MSCCL block takes a whole SM (NCCL_MAX_NTHREADS threads
    and most of its shared memory), and `SM_HEADROOM` SMs stay free for other work: a
    V100 (80 SMs) gets 78, the number at which an independent simulator found a
    121-threadblock file deadlock."""
    return max(1, sms - SM_HEADROOM)


def threadblock_excess(gpu_tbs: int, sms: int) -> str | None:
    """Why `gpu_tbs` threadblocks are too many on a GPU of `sms` SMs, or None."""
    limit = resident_threadblocks(sms)
    if gpu_tbs <= limit:
        return None
    return (f"{gpu_tbs} threadblocks, but a GPU of {sms} SMs keeps at most {limit} resident at once "
            f"({sms} less {SM_HEADROOM} left to other kernels); every threadblock of a GPU must run at the same "
            "time, since they wait on each other")


def check_limits(algo: XmlAlgo, max_steps: int = MAX_STEPS, max_nodes: int = MAX_XML_NODES) -> None:
    if algo.nchannels > MAX_CHANNELS:
        raise LimitError(f"the program uses {algo.nchannels} channels; MSCCL has at most {MAX_CHANNELS} "
                         "(use fewer instances or channels)")
    for gpu in algo.gpus:
        nodes = 1 + algo.ngpus + len(gpu.tbs) + sum(len(tb.steps) for tb in gpu.tbs)
        if nodes > max_nodes:
            raise LimitError(f"GPU {gpu.id} needs {nodes} XML nodes (<algo>, {algo.ngpus} <gpu>, its <tb>s and "
                             f"<step>s); the executor's parser reads at most {max_nodes} per rank (use fewer "
                             "chunks per rank or fewer instances)")
        per_channel = Counter(tb.chan for tb in gpu.tbs)
        for chan, n in sorted(per_channel.items()):
            if n > MAX_TBS_PER_CHANNEL:
                raise LimitError(f"GPU {gpu.id} has {n} threadblocks on channel {chan}; MSCCL allows "
                                 f"{MAX_TBS_PER_CHANNEL} per channel")
        sizes = {BufferName.INPUT: gpu.i_chunks, BufferName.OUTPUT: gpu.o_chunks, BufferName.SCRATCH: gpu.s_chunks}
        for tb in gpu.tbs:
            where = f"GPU {gpu.id} threadblock {tb.id} (send {tb.send}, recv {tb.recv}, channel {tb.chan})"
            if not 0 <= tb.chan < MAX_CHANNELS:
                raise LimitError(f"{where} uses channel {tb.chan}; MSCCL has channels 0..{MAX_CHANNELS - 1}")
            if len(tb.steps) > max_steps:
                raise LimitError(
                    f"{where} has {len(tb.steps)} steps ({sum(s.type is StepType.NOP for s in tb.steps)} of them "
                    f"nop steps for dependencies), more than max_steps={max_steps}; raise max_steps if the runtime "
                    "allows more (the current MSCCL executor runs 64 per threadblock, the older runtime 256), or "
                    "spread the schedule over more channels (msccl-threadblocks{channels=N})")
            for step in tb.steps:
                _check_step(where, step, sizes)


def _check_step(where: str, step, sizes: dict[BufferName, int]) -> None:
    if step.type is StepType.NOP:
        return
    if not 0 < step.cnt < MAX_COUNT:
        raise LimitError(f"{where} step {step.s} moves {step.cnt} chunks; an MSCCL step moves 1 to "
                         f"{MAX_COUNT - 1} (run msccl-merge, which splits larger ops)")
    if step.depid > MAX_DEPENDENCY_TB:
        raise LimitError(f"{where} step {step.s} depends on threadblock {step.depid}; the executor stores "
                         f"dependencies in 8 bits (threadblocks 0..{MAX_DEPENDENCY_TB})")
    local = _LOCAL_OPERANDS[id(step.type)]
    for role, buf, off in (("src", step.srcbuf, step.srcoff), ("dst", step.dstbuf, step.dstoff)):
        if role not in local or buf is None:
            continue
        if off < 0 or off + step.cnt > sizes[buf] or off > MAX_OFFSET:
            raise LimitError(f"{where} step {step.s} uses {buf.value}[{off}..{off + step.cnt}), but the GPU "
                             f"declares {sizes[buf]} {buf.value} chunks")


def _local_operands(kind: StepType) -> tuple[str, ...]:
    if kind in (StepType.SEND, StepType.RECV_REDUCE_SEND):
        return ("src",)
    if kind in (StepType.RECV, StepType.RECV_COPY_SEND):
        return ("dst",)
    return ("src", "dst")


# By the step type's identity: asked once per step (two million at 1,024 GPUs), and an
# Enum's hash and a tuple test of str-enum members run Python code.
_LOCAL_OPERANDS = {id(kind): _local_operands(kind) for kind in StepType}


@register_pass
@dataclass(frozen=True)
class CheckLimits(Pass):
    name = "msccl-limits"
    summary = "check the MSCCL executor's limits (steps per threadblock, cnt, channels, XML nodes)"
    max_steps: int = MAX_STEPS
    max_nodes: int = MAX_XML_NODES

    @collections_paused
    def run(self, unit: CompileUnit) -> CompileUnit:
        if not isinstance(unit.lowered, XmlAlgo):
            raise CollcError(f"{self.name} checks an MSCCL XML program; run msccl-assemble before it")
        check_limits(unit.lowered, self.max_steps, self.max_nodes)
        longest = max((len(tb.steps) for g in unit.lowered.gpus for tb in g.tbs), default=0)
        return unit.with_note(self.name, ok=True, longest_threadblock=longest)
