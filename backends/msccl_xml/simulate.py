"""Run an MSCCL XML program symbolically, the way the executor runs it on GPUs.

The model (checked against the MSCCL executor, `Azure/msccl-executor-nccl`:
`src/misc/msccl/msccl_parser.cc` and the interpreter in `src/device/msccl_kernel.cu`):

- Each threadblock is a sequential program. The executor does not run XML steps one by
  one: it compiles a threadblock into *transmissions*. A `nop` is not a transmission;
  its dependency is added to the next transmission's list of waits (which is why the
  executor rejects a file where `nop`s are followed by a step without a dependency of
  its own, and why `nop`s at the end of a threadblock wait for nothing). Consecutive
  `re` steps with the same destination and source buffer and no dependency of their own
  are fused into one transmission (at most 16). `compile_threadblock` reproduces this.
- Progress numbers: after a transmission with `hasdep="1"` the threadblock publishes a
  counter the executor keeps alongside, which equals the XML `s` of the transmission's
  last step when every `nop` carries a dependency and `s` counts from 0 in document
  order. A wait for (tb B, step S) is met once B has published a number >= S (the
  executor spins on `flag >= goal`), so a dependency on a step without `hasdep` is only
  met by a later published step.
- Each (sender GPU, receiver GPU, channel) connection is a FIFO of messages; a message
  is the list of `cnt` chunk values one send-type step pushes. A receive-type step takes
  the next message from its `recv` peer on its channel. FIFOs are unbounded here; the
  hardware connection holds a few slots, which only delays a sender that runs ahead.
- Step semantics (device code, `prims.*` calls): `s` sends src; `r` stores the message
  in dst; `rcs` stores it in dst and forwards it; `rrs` reduces it with src and sends
  the sum without storing it; `rrc` reduces it with src and stores the sum in dst;
  `rrcs` reduces with src, stores in dst and sends; `cpy` copies src to dst; `re` is
  dst = dst + src (the kernel loads dst, applies the reduction with each fused source,
  stores dst); `nop` does nothing but wait. In the real files `rrc` always names the
  same slot as src and dst, so "reduce into dst" and "reduce with src" agree there.

Values are symbolic: a slot holds a `frozenset[ChunkId]` (a reduction is a union; one
that would count a chunk twice is an error), or nothing. Threadblocks run round-robin,
each as far as it can, until all finish or none can move (a deadlock, reported with what
each blocked threadblock waits for). Beside the values the executor tracks
happens-before with vector clocks (program order, message edges, dependency edges) and
reports two accesses to one slot, at least one a write, that nothing orders: such a
race means some interleaving the GPU may choose computes something else. With no race
reported, the values found are those of every interleaving.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import NamedTuple

import networkx as nx
import numpy as np

from collc.backends.msccl_xml.model import BufferName, StepType, XmlAlgo, XmlStep, XmlThreadblock
from collc.ir.collective import Value, value_str

# The executor fuses at most this many consecutive `re` steps into one transmission
# (MSCCL_MAX_REDUCE_FUSION in msccl_struct.h).
MAX_REDUCE_FUSION = 16

BUFFER_WORDS = {BufferName.INPUT: "input", BufferName.OUTPUT: "output", BufferName.SCRATCH: "scratch"}
# Looked up once per step in the executor's inner loop.
RECEIVING = frozenset(t for t in StepType if t.receives)
SENDING = frozenset(t for t in StepType if t.sends)


class _Poison:
    """What a slot holds after an error already reported made its value unknowable."""

    _instance: "_Poison | None" = None

    def __new__(cls) -> "_Poison":
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "POISON"


POISON = _Poison()
Symbolic = Value | None | _Poison  # a slot: a set of chunks, nothing yet, or unknowable


@dataclass(frozen=True)
class StepRef:
    """Where a step is: GPU, threadblock, its `s`, and its line in the file."""

    gpu: int
    tb: int
    s: int
    line: int | None = None

    def __str__(self) -> str:
        return f"GPU {self.gpu} tb {self.tb} step {self.s}"

    @classmethod
    def of(cls, gpu: int, tb: XmlThreadblock, step: XmlStep) -> "StepRef":
        return cls(gpu, tb.id, step.s, step.line)


class Severity(str, Enum):
    ERROR = "error"
    WARNING = "warning"


class IssueKind(str, Enum):
    UNWRITTEN_READ = "unwritten-read"
    DOUBLE_COUNT = "double-count"
    RACE = "race"
    DEADLOCK = "deadlock"
    UNRECEIVED = "unreceived"
    COUNT_MISMATCH = "count-mismatch"
    EXECUTOR_REJECTS = "executor-rejects"
    EXECUTOR_OVERFLOW = "executor-overflow"
    IGNORED_WAIT = "ignored-wait"
    RENUMBERED = "renumbered"


@dataclass(frozen=True)
class Issue:
    kind: IssueKind
    message: str
    where: StepRef | None
    severity: Severity = Severity.ERROR
    notes: tuple[str, ...] = ()


# --- compiling a threadblock the way the executor does ------------------------------------

@dataclass(frozen=True)
class Wait:
    """Wait until threadblock `tb` of the same GPU has published progress >= `step`."""

    tb: int
    step: int
    origin: XmlStep  # the step (often a nop) whose depid/deps declared it


@dataclass
class Instruction:
    """One transmission: a step, or consecutive `re` steps the executor fuses."""

    steps: list[XmlStep]
    waits: list[Wait]
    publishes: bool = False
    number: int = 0  # the progress number the executor publishes after it


@dataclass
class ThreadblockProgram:
    gpu: int
    tb: XmlThreadblock
    instructions: list[Instruction]
    notes: list[Issue] = field(default_factory=list)

    @property
    def sends(self) -> bool:
        return any(s.type.sends for i in self.instructions for s in i.steps)

    @property
    def receives(self) -> bool:
        return any(s.type.receives for i in self.instructions for s in i.steps)


def compile_threadblock(gpu: int, tb: XmlThreadblock) -> ThreadblockProgram:
    """The transmissions the executor builds from a threadblock's steps, with the notes a
    user needs where its reading differs from the document's."""
    instructions: list[Instruction] = []
    notes: list[Issue] = []
    pending: list[Wait] = []  # waits of nops not yet attached to a transmission
    fusing: tuple[BufferName | None, int, BufferName | None] | None = None  # open `re` group
    # The executor closes a group when its count of `re` steps in the whole threadblock
    # (not in the group) reaches MAX_REDUCE_FUSION; reproduced as written.
    reductions = 0
    for step in tb.steps:
        ref = StepRef.of(gpu, tb, step)
        if step.depid >= 0:
            pending.append(Wait(step.depid, step.deps, step))
        if step.type is StepType.NOP:
            continue
        key = (step.dstbuf, step.dstoff, step.srcbuf)
        if step.type is StepType.REDUCE and fusing == key and step.depid < 0:
            current = instructions[-1]
            current.steps.append(step)
        else:
            if pending and step.depid < 0:
                notes.append(Issue(
                    IssueKind.EXECUTOR_REJECTS,
                    f"{ref} follows nop steps with dependencies but has none of its own; the executor "
                    "attaches a nop's dependency to the next step and rejects the whole file unless that "
                    "step has a dependency too (give it the last nop's depid/deps)", ref))
            current = Instruction([step], pending)
            pending = []
            instructions.append(current)
        current.publishes = step.hasdep
        if step.type is StepType.REDUCE:
            reductions += 1
            if len(current.steps) == MAX_REDUCE_FUSION + 1:
                notes.append(Issue(
                    IssueKind.EXECUTOR_OVERFLOW,
                    f"{ref} is the {MAX_REDUCE_FUSION + 1}th consecutive re step into "
                    f"{BUFFER_WORDS[step.dstbuf]}[{step.dstoff}] that the executor fuses into one reduction; its "
                    f"kernel holds {MAX_REDUCE_FUSION} sources (give a step in between hasdep=\"1\")",
                    ref))  # type: ignore[index]
        fusing = key if step.type is StepType.REDUCE and not step.hasdep and reductions != MAX_REDUCE_FUSION else None
    for wait in pending:
        ref = StepRef.of(gpu, tb, wait.origin)
        notes.append(Issue(
            IssueKind.IGNORED_WAIT,
            f"{ref} is a trailing nop: the executor attaches a nop's dependency to the next transmission, "
            f"and none follows, so its wait for tb {wait.tb} step {wait.step} is ignored", ref, Severity.WARNING))
    # A rejected file shifts the count too; the rejection is the note worth reading.
    _number(gpu, tb, instructions, notes,
            explain=not any(n.kind is IssueKind.EXECUTOR_REJECTS for n in notes))
    return ThreadblockProgram(gpu, tb, instructions, notes)


def _number(gpu: int, tb: XmlThreadblock, instructions: list[Instruction], notes: list[Issue], *,
            explain: bool) -> None:
    """The executor's progress counter: each wait beyond the first stands for a nop, each
    fused `re` beyond the first for one step."""
    counter = 0
    noted = not explain
    for instr in instructions:
        if instr.waits:
            counter += len(instr.waits) - 1
        counter += len(instr.steps) - 1
        instr.number = counter
        last = instr.steps[-1]
        if instr.number != last.s and not noted:
            noted = True  # later steps inherit the shift; one note per threadblock
            ref = StepRef.of(gpu, tb, last)
            notes.append(Issue(
                IssueKind.RENUMBERED,
                f"the executor counts {ref} as step {instr.number}, not {last.s}: it counts a nop only "
                "through the dependency the nop adds to the next step, so a nop without one is not counted; "
                "dependencies on this threadblock are matched against the executor's count", ref,
                Severity.WARNING))
        counter += 1


# --- memory -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class RankLayout:
    """How a rank's buffers sit in memory: the physical buffers and their sizes, and for
    each buffer name the steps use, the physical buffer and offset it starts at (an
    in-place input is a window of the output, or the other way round)."""

    sizes: Mapping[BufferName, int]
    views: Mapping[BufferName, tuple[BufferName, int]]

    @classmethod
    def separate(cls, i_chunks: int, o_chunks: int, s_chunks: int) -> "RankLayout":
        return cls({BufferName.INPUT: i_chunks, BufferName.OUTPUT: o_chunks, BufferName.SCRATCH: s_chunks},
                   {b: (b, 0) for b in BufferName})

    def locate(self, buffer: BufferName, index: int) -> tuple[BufferName, int]:
        physical, base = self.views[buffer]
        return physical, base + index


@dataclass
class SimulationResult:
    layouts: Sequence[RankLayout]
    memory: list[dict[BufferName, list[Symbolic]]]
    writers: dict[tuple[int, BufferName, int], StepRef]
    issues: list[Issue]
    finished: bool
    suppressed: int = 0  # issues past the cap, counted but not kept

    def value(self, rank: int, buffer: BufferName, index: int) -> Symbolic:
        physical, i = self.layouts[rank].locate(buffer, index)
        return self.memory[rank][physical][i]

    def last_writer(self, rank: int, buffer: BufferName, index: int) -> StepRef | None:
        physical, i = self.layouts[rank].locate(buffer, index)
        return self.writers.get((rank, physical, i))

    @property
    def errors(self) -> list[Issue]:
        return [i for i in self.issues if i.severity is Severity.ERROR]


# --- the executor ----------------------------------------------------------------------------

@dataclass
class _Message:
    values: list[Symbolic]
    clock: np.ndarray
    sender: StepRef


@dataclass
class _Access:
    tb: int  # global threadblock index
    epoch: int
    ref: StepRef


@dataclass
class _Thread:
    index: int  # global index, the vector clock's coordinate
    program: ThreadblockProgram
    clock: np.ndarray
    pc: int = 0
    published_numbers: list[int] = field(default_factory=list)
    published_clocks: list[np.ndarray] = field(default_factory=list)

    @property
    def gpu(self) -> int:
        return self.program.gpu

    @property
    def tb(self) -> XmlThreadblock:
        return self.program.tb

    @property
    def done(self) -> bool:
        return self.pc >= len(self.program.instructions)

    @property
    def progress(self) -> int:
        return self.published_numbers[-1] if self.published_numbers else -1


Connection = tuple[int, int, int]  # (sender GPU, receiver GPU, channel)


class _BlockKind(str, Enum):
    PROGRESS = "progress"  # a dependency: key (gpu, tb, -1)
    DATA = "data"  # a receive on an empty connection
    ROOM = "room"  # a send on a full connection (only with a FIFO capacity)


class _Block(NamedTuple):
    kind: _BlockKind
    key: tuple[int, int, int]


class Simulator:
    def __init__(self, algo: XmlAlgo, layouts: Sequence[RankLayout], inputs: Sequence[Sequence[Value]],
                 programs: Sequence[Sequence[ThreadblockProgram]] | None = None, *,
                 max_issues: int = 50, check_races: bool = True, fifo_capacity: int | None = None):
        self.algo = algo
        self.fifo_capacity = fifo_capacity
        self.layouts = layouts
        self.max_issues = max_issues
        self.check_races = check_races
        if programs is None:
            programs = [[compile_threadblock(g.id, tb) for tb in g.tbs] for g in algo.gpus]
        flat = [p for per_gpu in programs for p in per_gpu]
        self.threads = [_Thread(k, p, np.zeros(len(flat), dtype=np.int32)) for k, p in enumerate(flat)]
        self.by_tb: dict[tuple[int, int], _Thread] = {(t.gpu, t.tb.id): t for t in self.threads}
        self.fifos: dict[Connection, deque[_Message]] = {}
        self.senders: dict[Connection, _Thread] = {}
        self.receivers: dict[Connection, _Thread] = {}
        for t in self.threads:
            if t.tb.send >= 0 and t.program.sends:
                self.senders.setdefault((t.gpu, t.tb.send, t.tb.chan), t)
            if t.tb.recv >= 0 and t.program.receives:
                self.receivers.setdefault((t.tb.recv, t.gpu, t.tb.chan), t)
        self.memory: list[dict[BufferName, list[Symbolic]]] = [
            {b: [None] * n for b, n in layout.sizes.items()} for layout in layouts]
        for rank, values in enumerate(inputs):
            for i, v in enumerate(values):
                physical, j = layouts[rank].locate(BufferName.INPUT, i)
                self.memory[rank][physical][j] = v
        self.writers: dict[tuple[int, BufferName, int], StepRef] = {}
        self.last_write: dict[tuple[int, BufferName, int], _Access] = {}
        self.reads: dict[tuple[int, BufferName, int], dict[int, _Access]] = {}
        self.raced: set[tuple[int, BufferName, int]] = set()
        self.issues: list[Issue] = []
        self.suppressed = 0
        # the instruction being executed
        self.thread: _Thread | None = None
        self.ref: StepRef | None = None

    # -- reporting ------------------------------------------------------------------------
    def report(self, issue: Issue) -> None:
        if len(self.issues) < self.max_issues:
            self.issues.append(issue)
        else:
            self.suppressed += 1

    # -- running ----------------------------------------------------------------------------
    def run(self) -> SimulationResult:
        ready: deque[_Thread] = deque(self.threads)
        queued = {t.index for t in self.threads}
        waiting: dict[_Block, list[_Thread]] = {}

        def wake(block: _Block) -> None:
            for t in waiting.pop(block, ()):
                if t.index not in queued:
                    queued.add(t.index)
                    ready.append(t)

        while ready:
            thread = ready.popleft()
            queued.discard(thread.index)
            while not thread.done:
                instr = thread.program.instructions[thread.pc]
                block = self.blocker(thread, instr)
                if block is not None:
                    waiting.setdefault(block, []).append(thread)
                    break
                received_on, sent_on = self.execute(thread, instr)
                thread.pc += 1
                if instr.publishes:
                    thread.published_numbers.append(instr.number)
                    thread.published_clocks.append(thread.clock.copy())
                    wake(_Block(_BlockKind.PROGRESS, (thread.gpu, thread.tb.id, -1)))
                if received_on is not None:
                    wake(_Block(_BlockKind.ROOM, received_on))
                if sent_on is not None:
                    wake(_Block(_BlockKind.DATA, sent_on))
        finished = all(t.done for t in self.threads)
        if finished:
            self.report_unreceived()
        else:
            self.report_deadlock()
        return SimulationResult(self.layouts, self.memory, self.writers, self.issues, finished, self.suppressed)

    def blocker(self, thread: _Thread, instr: Instruction) -> "_Block | None":
        """What keeps `instr` from starting: progress of a threadblock it waits for, a
        message on an empty connection, or room on a full one."""
        for wait in instr.waits:
            target = self.by_tb.get((thread.gpu, wait.tb))
            if target is None or target.progress < wait.step:
                return _Block(_BlockKind.PROGRESS, (thread.gpu, wait.tb, -1))
        first = instr.steps[0]
        if first.type in RECEIVING:
            conn = (thread.tb.recv, thread.gpu, thread.tb.chan)
            if not self.fifos.get(conn):
                return _Block(_BlockKind.DATA, conn)
        if self.fifo_capacity is not None and any(s.type in SENDING for s in instr.steps):
            conn = (thread.gpu, thread.tb.send, thread.tb.chan)
            if len(self.fifos.get(conn, ())) >= self.fifo_capacity:
                return _Block(_BlockKind.ROOM, conn)
        return None

    def execute(self, thread: _Thread, instr: Instruction) -> tuple[Connection | None, Connection | None]:
        """Run one transmission; returns the connections it received and sent on."""
        self.thread = thread
        clock = thread.clock
        for wait in instr.waits:
            target = self.by_tb[(thread.gpu, wait.tb)]
            k = bisect.bisect_left(target.published_numbers, wait.step)
            np.maximum(clock, target.published_clocks[k], out=clock)
        message: _Message | None = None
        received_on: Connection | None = None
        if instr.steps[0].type in RECEIVING:
            received_on = (thread.tb.recv, thread.gpu, thread.tb.chan)
            message = self.fifos[received_on].popleft()
            np.maximum(clock, message.clock, out=clock)
        clock[thread.index] += 1
        sent_on: Connection | None = None
        for step in instr.steps:
            self.ref = StepRef.of(thread.gpu, thread.tb, step)
            outgoing = self.step(step, message)
            if outgoing is not None:
                sent_on = (thread.gpu, thread.tb.send, thread.tb.chan)
                self.fifos.setdefault(sent_on, deque()).append(_Message(outgoing, clock.copy(), self.ref))
        return received_on, sent_on

    # -- step semantics -----------------------------------------------------------------------
    def step(self, step: XmlStep, message: _Message | None) -> list[Symbolic] | None:
        """Apply one step to memory; returns the values it sends, if it sends."""
        t, n = step.type, step.cnt
        incoming: list[Symbolic] = []
        if t in RECEIVING:
            assert message is not None
            incoming = list(message.values)
            if len(incoming) != n:
                self.report(Issue(
                    IssueKind.COUNT_MISMATCH,
                    f"{self.ref} receives {n} chunk(s), but the message it takes ({message.sender}) carries "
                    f"{len(incoming)}", self.ref))
                incoming = (incoming + [POISON] * n)[:n]
        if t is StepType.SEND:
            return [self.read(step.srcbuf, step.srcoff + i) for i in range(n)]
        if t is StepType.RECV:
            self.write_all(step.dstbuf, step.dstoff, incoming)
            return None
        if t is StepType.RECV_COPY_SEND:
            self.write_all(step.dstbuf, step.dstoff, incoming)
            return incoming
        if t is StepType.COPY:
            self.write_all(step.dstbuf, step.dstoff, [self.read(step.srcbuf, step.srcoff + i) for i in range(n)])
            return None
        if t is StepType.REDUCE:
            sums = [self.reduce(self.read(step.dstbuf, step.dstoff + i), self.read(step.srcbuf, step.srcoff + i))
                    for i in range(n)]
            self.write_all(step.dstbuf, step.dstoff, sums)
            return None
        if t.reduces:  # rrs, rrc, rrcs: the message reduced with src
            sums = [self.reduce(incoming[i], self.read(step.srcbuf, step.srcoff + i)) for i in range(n)]
            if t is not StepType.RECV_REDUCE_SEND:
                self.write_all(step.dstbuf, step.dstoff, sums)
            return sums if t.sends else None
        return None  # nop

    def reduce(self, a: Symbolic, b: Symbolic) -> Symbolic:
        if a is POISON or b is POISON or a is None or b is None:
            return POISON
        twice = a & b  # type: ignore[operator]
        if twice:
            self.report(Issue(
                IssueKind.DOUBLE_COUNT,
                f"{self.ref} reduces {value_str(a)} with {value_str(b)}, counting {value_str(twice)} twice",
                self.ref))
        return a | b  # type: ignore[operator]

    def read(self, buffer: BufferName | None, index: int) -> Symbolic:
        assert buffer is not None and self.thread is not None and self.ref is not None
        rank = self.thread.gpu
        physical, i = self.layouts[rank].locate(buffer, index)
        key = (rank, physical, i)
        if self.check_races:
            self.check_read(key, buffer, index)
        value = self.memory[rank][physical][i]
        if value is None:
            self.report(Issue(
                IssueKind.UNWRITTEN_READ,
                f"{self.ref} reads {BUFFER_WORDS[buffer]}[{index}] of GPU {rank}, which nothing has written "
                "before this step", self.ref))
            return POISON
        return value

    def write_all(self, buffer: BufferName | None, offset: int, values: list[Symbolic]) -> None:
        for i, v in enumerate(values):
            self.write(buffer, offset + i, v)

    def write(self, buffer: BufferName | None, index: int, value: Symbolic) -> None:
        assert buffer is not None and self.thread is not None and self.ref is not None
        rank = self.thread.gpu
        physical, i = self.layouts[rank].locate(buffer, index)
        key = (rank, physical, i)
        if self.check_races:
            self.check_write(key, buffer, index)
        self.memory[rank][physical][i] = value
        self.writers[key] = self.ref

    # -- races -------------------------------------------------------------------------------------
    def ordered(self, earlier: _Access) -> bool:
        assert self.thread is not None
        return int(self.thread.clock[earlier.tb]) >= earlier.epoch

    def access(self) -> _Access:
        assert self.thread is not None and self.ref is not None
        return _Access(self.thread.index, int(self.thread.clock[self.thread.index]), self.ref)

    def check_read(self, key: tuple[int, BufferName, int], buffer: BufferName, index: int) -> None:
        write = self.last_write.get(key)
        if write is not None and not self.ordered(write):
            self.report_race(key, buffer, index, write, "writes", "reads")
        self.reads.setdefault(key, {})[self.thread.index] = self.access()  # type: ignore[union-attr]

    def check_write(self, key: tuple[int, BufferName, int], buffer: BufferName, index: int) -> None:
        write = self.last_write.get(key)
        if write is not None and not self.ordered(write):
            self.report_race(key, buffer, index, write, "writes", "writes")
        for read in self.reads.pop(key, {}).values():
            if not self.ordered(read):
                self.report_race(key, buffer, index, read, "reads", "writes")
                break
        self.last_write[key] = self.access()

    def report_race(self, key: tuple[int, BufferName, int], buffer: BufferName, index: int,
                    other: _Access, other_does: str, this_does: str) -> None:
        if other.tb == self.thread.index or key in self.raced:  # type: ignore[union-attr]
            return
        self.raced.add(key)
        notes = [f"{other.ref} is at line {other.ref.line}"] if other.ref.line else []
        rank, physical, i = key
        if (physical, i) != (buffer, index):
            notes.append(f"in this arrangement {BUFFER_WORDS[buffer]}[{index}] is {BUFFER_WORDS[physical]}[{i}] "
                         "of the same GPU (in-place buffers overlap)")
        self.report(Issue(
            IssueKind.RACE,
            f"race on {BUFFER_WORDS[buffer]}[{index}] of GPU {rank}: {self.ref} {this_does} it and "
            f"{other.ref} {other_does} it, and no dependency or message orders the two", self.ref,
            notes=tuple(notes)))

    # -- the end ----------------------------------------------------------------------------------
    def report_unreceived(self) -> None:
        for (src, dst, chan), fifo in sorted(self.fifos.items()):
            if fifo:
                first = fifo[0]
                self.report(Issue(
                    IssueKind.UNRECEIVED,
                    f"{first.sender} sends to GPU {dst} on channel {chan}, but no step of GPU {dst} receives it "
                    f"({len(fifo)} message(s) left on that connection)", first.sender))

    def waits_for(self, thread: _Thread) -> tuple[str, _Thread | None, StepRef]:
        """Why a blocked threadblock cannot go on: a sentence, the threadblock it waits
        for (if any) and the step that declared the wait."""
        instr = thread.program.instructions[thread.pc]
        for wait in instr.waits:
            target = self.by_tb.get((thread.gpu, wait.tb))
            origin = StepRef.of(thread.gpu, thread.tb, wait.origin)
            if target is None:
                return f"{origin} waits for tb {wait.tb}, which does not exist", None, origin
            if target.progress < wait.step:
                return (f"{origin} waits for GPU {thread.gpu} tb {wait.tb} to finish step {wait.step}, "
                        f"{self.state(target)}", target, origin)
        first = instr.steps[0]
        ref = StepRef.of(thread.gpu, thread.tb, first)
        chan = thread.tb.chan
        if first.type.receives and not self.fifos.get((thread.tb.recv, thread.gpu, chan)):
            peer = thread.tb.recv
            sender = self.senders.get((peer, thread.gpu, chan))
            if sender is None:
                return f"{ref} waits for a message from GPU {peer} on channel {chan}, which nothing sends", None, ref
            return (f"{ref} waits for a message from GPU {peer} on channel {chan}, which GPU {peer} tb "
                    f"{sender.tb.id} sends; that threadblock {self.state(sender, own=True)}", sender, ref)
        peer = thread.tb.send
        receiver = self.receivers.get((thread.gpu, peer, chan))
        held = len(self.fifos.get((thread.gpu, peer, chan), ()))
        if receiver is None:
            return (f"{ref} waits for room on its full connection to GPU {peer} on channel {chan} ({held} "
                    "messages), which nothing receives", None, ref)
        return (f"{ref} waits for room on its full connection to GPU {peer} on channel {chan} ({held} messages, "
                f"the capacity), which GPU {peer} tb {receiver.tb.id} empties; that threadblock "
                f"{self.state(receiver, own=True)}", receiver, ref)

    def state(self, thread: _Thread, *, own: bool = False) -> str:
        who = "" if own else f"but tb {thread.tb.id} "
        if thread.done:
            return f"{who}has finished without it".strip()
        step = thread.program.instructions[thread.pc].steps[0]
        published = f"after step {thread.progress}" if thread.progress >= 0 else "before publishing any step"
        return f"{who}is blocked at step {step.s} ({published})".strip()

    def report_deadlock(self) -> None:
        blocked = [t for t in self.threads if not t.done]
        graph = nx.DiGraph()
        reasons: list[tuple[str, StepRef]] = []
        for t in blocked:
            sentence, target, origin = self.waits_for(t)
            reasons.append((sentence, origin))
            graph.add_node(t.index)
            if target is not None and not target.done:
                graph.add_edge(t.index, target.index)
        notes: list[str] = []
        where = reasons[0][1]
        try:
            cycle = nx.find_cycle(graph)
        except nx.NetworkXNoCycle:
            cycle = []
        if cycle:
            members = [self.threads[a] for a, _ in cycle]
            notes.append("wait cycle: " + " -> ".join(f"GPU {m.gpu} tb {m.tb.id}" for m in members + members[:1]))
            where = reasons[blocked.index(members[0])][1]
        shown = 12
        notes.extend(sentence for sentence, _ in reasons[:shown])
        if len(reasons) > shown:
            notes.append(f"... and {len(reasons) - shown} more blocked threadblocks")
        headline = next(s for s, ref in reasons if ref == where)
        self.report(Issue(
            IssueKind.DEADLOCK,
            f"deadlock: {len(blocked)} threadblock(s) can never finish; {headline}", where, notes=tuple(notes)))


def simulate(algo: XmlAlgo, layouts: Sequence[RankLayout], inputs: Sequence[Sequence[Value]], *,
             programs: Sequence[Sequence[ThreadblockProgram]] | None = None, max_issues: int = 50,
             check_races: bool = True, fifo_capacity: int | None = None) -> SimulationResult:
    """Run `algo` with rank r's input slot i holding `inputs[r][i]` and memory laid out as
    `layouts[r]`. The program must be structurally valid (`verify_algo` checks that first):
    peers, offsets and dependencies in range, one threadblock per connection end.

    `fifo_capacity` bounds the messages a connection holds (a send then waits for the
    receiver); None leaves FIFOs unbounded, the reading of the XML format itself."""
    return Simulator(algo, layouts, inputs, programs, max_issues=max_issues, check_races=check_races,
                     fifo_capacity=fifo_capacity).run()
