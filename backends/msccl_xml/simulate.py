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

Values are symbolic: a slot holds a set of chunks (a reduction is a union; one that
would count a chunk twice is an error), or nothing; sets are encoded as ints and rank
bit masks (`ChunkCodec`). Threadblocks run round-robin, each as far as it can, until all
finish or none can move (a deadlock, reported with what each blocked threadblock waits
for). Beside the values the executor tracks happens-before (program order, message
edges, dependency edges; see "Happens-before" below) and reports two accesses to one
slot, at least one a write, that nothing orders: such a race means some interleaving
the GPU may choose computes something else. With no race reported, the values found are
those of every interleaving.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import NamedTuple

import networkx as nx
import numpy as np

from collc.backends.msccl_xml.model import BufferName, StepType, XmlAlgo, XmlStep, XmlThreadblock
from collc.ir.collective import ChunkId, Value, value_str
from collc.ir.graphs import mask_members

# Entries the searches' memos may hold in all (`Simulator.search`); past it they start
# afresh (about 100 bytes an entry).
MEMO_ENTRIES = 2_000_000
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


class StepRef(NamedTuple):
    """Where a step is: GPU, threadblock, its `s`, and its line in the file (a tuple:
    one is made per step checked, hundreds of thousands per file)."""

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

@dataclass(frozen=True, slots=True)
class Wait:
    """Wait until threadblock `tb` of the same GPU has published progress >= `step`."""

    tb: int
    step: int
    origin: XmlStep  # the step (often a nop) whose depid/deps declared it


@dataclass(slots=True)
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
                ref = StepRef.of(gpu, tb, step)
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
                ref = StepRef.of(gpu, tb, step)
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


# --- values ----------------------------------------------------------------------------------
# A slot's value is a set of chunks. Python frozensets of ChunkIds cost about 200 bytes a
# value and a union copies every element: at 256 GPUs the simulator spent most of its time
# and gigabytes on them. Here a value is one of three small objects:
#
# - an int, for one chunk: `(index << shift) | rank` (shift holds the largest rank);
# - a tuple `(index, mask)`, for a reduction whose chunks share one index (every
#   standard reduction): the mask's bits are the contributing ranks, two or more;
# - a frozenset of chunk codes, for a reduction that mixes indices (only wrong or custom
#   programs make one).
#
# Each value has exactly one form (`ChunkCodec.normal`), so equal sets compare equal. A copy
# shares the object; a union of two same-index values is one `|`, a double count one `&`.
# Sets of ChunkIds come back only for messages and `SimulationResult.value`.

Code = int | tuple[int, int] | frozenset[int]


class ChunkCodec:
    """frozenset[ChunkId] <-> Code for chunks whose ranks lie in 0..ranks-1."""

    def __init__(self, ranks: int):
        self.shift = max(1, (max(ranks, 1) - 1).bit_length())
        self.rank_mask = (1 << self.shift) - 1

    def chunk(self, rank: int, index: int) -> int:
        return (index << self.shift) | rank

    def sum_over_ranks(self, ranks: int, index: int) -> Code:
        """chunk(0, index) + ... + chunk(ranks - 1, index)."""
        return self.chunk(0, index) if ranks == 1 else (index, (1 << ranks) - 1)

    def encode(self, value: Value) -> Code:
        codes = set()
        for c in value:
            if not (0 <= c.rank <= self.rank_mask and c.index >= 0):
                raise ValueError(f"{c} is outside the ranks this simulation encodes")
            codes.add(self.chunk(c.rank, c.index))
        return self.normal(codes)

    def normal(self, codes: set[int] | frozenset[int]) -> Code:
        """The one form of a non-empty set of chunk codes."""
        if len(codes) == 1:
            return next(iter(codes))
        shift = self.shift
        indices = {c >> shift for c in codes}
        if len(indices) == 1:
            mask = 0
            for c in codes:
                mask |= 1 << (c & self.rank_mask)
            return (indices.pop(), mask)
        return frozenset(codes)

    def codes(self, value: Code) -> frozenset[int]:
        if type(value) is int:
            return frozenset((value,))
        if type(value) is tuple:
            index, mask = value  # type: ignore[misc]
            base = index << self.shift
            return frozenset(base | r for r in mask_members(mask))
        return value  # type: ignore[return-value]

    def decode(self, value: Code) -> Value:
        shift, low = self.shift, self.rank_mask
        return frozenset(ChunkId(c & low, c >> shift) for c in self.codes(value))

    def combine(self, a: Code, b: Code) -> tuple[Code, Code | None]:
        """a + b, and the chunks they both hold (a double count) or None."""
        ta, tb = type(a), type(b)
        if ta is not frozenset and tb is not frozenset:
            shift = self.shift
            if ta is int:
                ia, ma = a >> shift, 1 << (a & self.rank_mask)  # type: ignore[operator]
            else:
                ia, ma = a  # type: ignore[misc]
            if tb is int:
                ib, mb = b >> shift, 1 << (b & self.rank_mask)  # type: ignore[operator]
            else:
                ib, mb = b  # type: ignore[misc]
            if ia == ib:
                twice = ma & mb
                return self._masked(ia, ma | mb), (self._masked(ia, twice) if twice else None)
        sa, sb = self.codes(a), self.codes(b)
        both = sa & sb
        return self.normal(sa | sb), (self.normal(both) if both else None)

    def _masked(self, index: int, mask: int) -> Code:
        if mask & (mask - 1):
            return (index, mask)
        return (index << self.shift) | (mask.bit_length() - 1)


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


class _Memory:
    """Every rank's physical buffers as one flat list of slots (a slot: rank, physical
    buffer, index); `start[rank][name]` is where a buffer name's view begins."""

    def __init__(self, layouts: Sequence[RankLayout]):
        self.layouts = layouts
        self.start: list[dict[BufferName, int]] = []
        self.physical: list[tuple[int, BufferName, int]] = []  # (base, buffer, size) in slot order
        self.room: list[dict[BufferName, int]] = []
        total = 0
        for layout in layouts:
            bases: dict[BufferName, int] = {}
            for buffer, size in layout.sizes.items():
                bases[buffer] = total
                self.physical.append((total, buffer, size))
                total += size
            self.start.append({name: bases[physical] + offset for name, (physical, offset) in layout.views.items()
                               if physical in bases})
            # how many slots each view has from its start to the end of its physical buffer
            self.room.append({name: layout.sizes[physical] - offset for name, (physical, offset)
                              in layout.views.items() if physical in bases})
        self.size = total
        self.bases = [b for b, _, _ in self.physical]

    def slot(self, rank: int, buffer: BufferName, index: int) -> int:
        self.check(rank, buffer, index, 1)
        return self.start[rank][buffer] + index

    def check(self, rank: int, buffer: BufferName, index: int, n: int) -> None:
        """Slots index..index+n-1 of a view lie in its physical buffer (the structural
        checks make sure of it; this keeps a flat list from being read past a buffer)."""
        if index < 0 or index + n > self.room[rank][buffer]:
            raise IndexError(f"{BUFFER_WORDS[buffer]}[{index}..{index + n - 1}] of rank {rank} is outside its buffer")

    def where(self, slot: int) -> tuple[BufferName, int]:
        """The physical buffer and index of a slot."""
        base, buffer, _ = self.physical[bisect.bisect_right(self.bases, slot) - 1]
        return buffer, slot - base


Access = tuple[int, int, XmlStep]  # (global threadblock index, event number, step): who touched a slot


@dataclass
class SimulationResult:
    layouts: Sequence[RankLayout]
    memory: "_Memory"
    values: list["Code | None | _Poison"]
    writers: list[Access | None]
    refs: Sequence[tuple[int, XmlThreadblock]]  # global threadblock index -> (GPU, tb)
    codec: "ChunkCodec"
    issues: list[Issue]
    finished: bool
    suppressed: int = 0  # issues past the cap, counted but not kept

    def code(self, rank: int, buffer: BufferName, index: int) -> "Code | None | _Poison":
        """A slot's value in the simulator's encoding (see `ChunkCodec`)."""
        return self.values[self.memory.slot(rank, buffer, index)]

    def value(self, rank: int, buffer: BufferName, index: int) -> Symbolic:
        code = self.code(rank, buffer, index)
        if code is None or code is POISON:
            return code
        return self.codec.decode(code)  # type: ignore[arg-type]

    def last_writer(self, rank: int, buffer: BufferName, index: int) -> StepRef | None:
        access = self.writers[self.memory.slot(rank, buffer, index)]
        if access is None:
            return None
        gpu, tb = self.refs[access[0]]
        return StepRef.of(gpu, tb, access[2])

    @property
    def errors(self) -> list[Issue]:
        return [i for i in self.issues if i.severity is Severity.ERROR]


# --- the executor ----------------------------------------------------------------------------
# Happens-before, without vector clocks. A vector clock per threadblock costs threadblocks^2
# (24,576^2 at 256 GPUs: gigabytes), and every message and published step copied one.
# Races are only ever between threadblocks of one GPU, so each threadblock keeps a clock
# over its own GPU's threadblocks (tens of entries), joined along dependency waits: a
# lower bound of the true clock that orders almost every access in real files. When it
# does not, the question goes to the execution itself, kept as a DAG of events (one per
# transmission run, in the order they ran; edges: program order, message from its
# send, wait from the published step that met it): an access a happens before the
# current event iff a search backwards from it reaches an event of a's threadblock at or
# after a. The search never passes below a (an event that ran before a cannot follow it),
# and what it finds raises the local clock, so a pattern is searched for once.


class _Message(NamedTuple):
    values: list
    event: int  # the send's event
    sender: int  # global threadblock index
    step: XmlStep


class _Published(NamedTuple):
    clock: np.ndarray  # the publisher's local clock just after the step
    event: int


Connection = tuple[int, int, int]  # (sender GPU, receiver GPU, channel)


class _BlockKind(str, Enum):
    PROGRESS = "progress"  # a dependency: key (gpu, tb, -1)
    DATA = "data"  # a receive on an empty connection
    ROOM = "room"  # a send on a full connection (only with a FIFO capacity)


@dataclass
class _Thread:
    index: int  # global index
    local: int  # index among its GPU's threadblocks: its coordinate in local clocks
    first: int  # global index of its GPU's first threadblock
    program: ThreadblockProgram
    # over its GPU's threadblocks: instructions of each known to precede (its own entry is
    # only written into the copies publications keep)
    clock: np.ndarray
    pc: int = 0
    published_numbers: list[int] = field(default_factory=list)
    # number -> its clock, kept while a wait that it meets has yet to run
    published: dict[int, _Published] = field(default_factory=dict)
    awaited: dict[int, int] = field(default_factory=dict)  # number -> waits it meets, not yet run
    events: list[int] = field(default_factory=list)  # its events, by pc
    # looked up once per transmission: kept, not recomputed
    gpu: int = field(init=False)
    tb: XmlThreadblock = field(init=False)
    receives_on: Connection = field(init=False)
    sends_on: Connection = field(init=False)
    progress_key: tuple = field(init=False)  # the _Block of a wait for its progress

    def __post_init__(self) -> None:
        self.gpu, self.tb = self.program.gpu, self.program.tb
        self.receives_on = (self.tb.recv, self.gpu, self.tb.chan)
        self.sends_on = (self.gpu, self.tb.send, self.tb.chan)
        self.progress_key = (_BlockKind.PROGRESS, (self.gpu, self.tb.id, -1))

    @property
    def done(self) -> bool:
        return self.pc >= len(self.program.instructions)

    @property
    def progress(self) -> int:
        return self.published_numbers[-1] if self.published_numbers else -1


PROGRESS, DATA, ROOM = _BlockKind.PROGRESS, _BlockKind.DATA, _BlockKind.ROOM


class _Block(NamedTuple):
    kind: _BlockKind
    key: tuple[int, int, int]


class Simulator:
    def __init__(self, algo: XmlAlgo, layouts: Sequence[RankLayout], inputs: Sequence[Sequence[Value]] | None,
                 programs: Sequence[Sequence[ThreadblockProgram]] | None = None, *,
                 max_issues: int = 50, check_races: bool = True, fifo_capacity: int | None = None,
                 input_chunks: Sequence[int] | None = None):
        self.algo = algo
        self.fifo_capacity = fifo_capacity
        self.layouts = layouts
        self.max_issues = max_issues
        self.check_races = check_races
        if programs is None:
            programs = [[compile_threadblock(g.id, tb) for tb in g.tbs] for g in algo.gpus]
        self.threads: list[_Thread] = []
        for per_gpu in programs:
            first = len(self.threads)
            for local, p in enumerate(per_gpu):
                self.threads.append(_Thread(first + local, local, first, p, np.zeros(len(per_gpu), dtype=np.int64)))
        self.refs = [(t.gpu, t.tb) for t in self.threads]
        self.by_tb: dict[tuple[int, int], _Thread] = {(t.gpu, t.tb.id): t for t in self.threads}
        self._count_awaited()
        self.fifos: dict[Connection, deque[_Message]] = {}
        self.senders: dict[Connection, _Thread] = {}
        self.receivers: dict[Connection, _Thread] = {}
        for t in self.threads:
            if t.tb.send >= 0 and t.program.sends:
                self.senders.setdefault((t.gpu, t.tb.send, t.tb.chan), t)
            if t.tb.recv >= 0 and t.program.receives:
                self.receivers.setdefault((t.tb.recv, t.gpu, t.tb.chan), t)
        self.mem = _Memory(layouts)
        self.values: list[Code | None | _Poison] = [None] * self.mem.size
        self.codec = self._load_inputs(inputs, input_chunks)
        self.writers: list[Access | None] = [None] * self.mem.size
        self.reads: dict[int, dict[int, Access]] = {}  # slot -> threadblock -> its read since the last write
        self.raced: set[int] = set()
        # the event DAG (see above): per event, its threadblock, pc and predecessors other
        # than program order (message send, met publications)
        self.ev_thread: list[int] = []
        self.ev_pc: list[int] = []
        self.ev_preds: list[tuple[int, ...] | None] = []
        # threadblock -> (bound, threadblock -> last event) of its complete searches (`search`)
        self.memos: dict[int, tuple[int, dict[int, int]]] = {}
        self.memo_entries = 0
        self.issues: list[Issue] = []
        self.suppressed = 0
        # the instruction being executed
        self.thread: _Thread | None = None
        self.event = -1
        self.current: XmlStep | None = None
        self.start: dict[BufferName, int] = {}  # the current GPU's views: where each starts
        self.room: dict[BufferName, int] = {}  # and how many slots it has

    def _load_inputs(self, inputs: Sequence[Sequence[Value]] | None, input_chunks: Sequence[int] | None) -> "ChunkCodec":
        """Rank r's input slot i holds inputs[r][i], or chunk(r, i) for i < input_chunks[r]."""
        mem, values = self.mem, self.values
        if input_chunks is not None:
            codec = ChunkCodec(len(input_chunks))
            for rank, n in enumerate(input_chunks):
                base = mem.start[rank][BufferName.INPUT]
                for i in range(n):
                    values[base + i] = codec.chunk(rank, i)
            return codec
        assert inputs is not None
        top = max((c.rank for per_rank in inputs for v in per_rank for c in v), default=0)
        codec = ChunkCodec(max(top + 1, len(inputs)))
        for rank, per_rank in enumerate(inputs):
            for i, v in enumerate(per_rank):
                values[mem.slot(rank, BufferName.INPUT, i)] = codec.encode(v)
        return codec

    def _count_awaited(self) -> None:
        """For each published step, how many waits it is the first to meet: its clock is
        kept until they have all run (the waits are in the program text)."""
        published = {t.index: [i.number for i in t.program.instructions if i.publishes] for t in self.threads}
        for t in self.threads:
            for instr in t.program.instructions:
                for wait in instr.waits:
                    target = self.by_tb.get((t.gpu, wait.tb))
                    if target is None:
                        continue
                    numbers = published[target.index]
                    k = bisect.bisect_left(numbers, wait.step)
                    if k < len(numbers):
                        target.awaited[numbers[k]] = target.awaited.get(numbers[k], 0) + 1

    @property
    def ref(self) -> StepRef:
        assert self.thread is not None and self.current is not None
        return StepRef.of(self.thread.gpu, self.thread.tb, self.current)

    def access_ref(self, access: Access) -> StepRef:
        gpu, tb = self.refs[access[0]]
        return StepRef.of(gpu, tb, access[2])

    # -- reporting ------------------------------------------------------------------------
    def report(self, issue: Issue) -> None:
        if len(self.issues) < self.max_issues:
            self.issues.append(issue)
        else:
            self.suppressed += 1

    def show(self, value: Code | None | _Poison) -> str:
        return value_str(None if value is None else self.codec.decode(value))  # type: ignore[arg-type]

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
            instructions = thread.program.instructions
            while thread.pc < len(instructions):
                instr = instructions[thread.pc]
                block = self.blocker(thread, instr)
                if block is not None:
                    waiting.setdefault(block, []).append(thread)
                    break
                received_on, sent_on = self.execute(thread, instr)
                thread.pc += 1
                if instr.publishes:
                    thread.published_numbers.append(instr.number)
                    if thread.awaited.get(instr.number):
                        clock = thread.clock.copy()
                        clock[thread.local] = thread.pc  # its own count: instructions run
                        thread.published[instr.number] = _Published(clock, self.event)
                    if waiting:  # plain tuples: equal to, and hashed as, the _Blocks waited on
                        wake(thread.progress_key)  # type: ignore[arg-type]
                if waiting and received_on is not None:
                    wake((ROOM, received_on))  # type: ignore[arg-type]
                if waiting and sent_on is not None:
                    wake((DATA, sent_on))  # type: ignore[arg-type]
        finished = all(t.done for t in self.threads)
        if finished:
            self.report_unreceived()
        else:
            self.report_deadlock()
        return SimulationResult(self.layouts, self.mem, self.values, self.writers, self.refs, self.codec,
                                self.issues, finished, self.suppressed)

    def blocker(self, thread: _Thread, instr: Instruction) -> "_Block | None":
        """What keeps `instr` from starting: progress of a threadblock it waits for, a
        message on an empty connection, or room on a full one."""
        for wait in instr.waits:
            target = self.by_tb.get((thread.gpu, wait.tb))
            if target is None or target.progress < wait.step:
                return _Block(_BlockKind.PROGRESS, (thread.gpu, wait.tb, -1))
        first = instr.steps[0]
        if first.type in RECEIVING:
            conn = thread.receives_on
            if not self.fifos.get(conn):
                return _Block(_BlockKind.DATA, conn)
        if self.fifo_capacity is not None and any(s.type in SENDING for s in instr.steps):
            conn = thread.sends_on
            if len(self.fifos.get(conn, ())) >= self.fifo_capacity:
                return _Block(_BlockKind.ROOM, conn)
        return None

    def execute(self, thread: _Thread, instr: Instruction) -> tuple[Connection | None, Connection | None]:
        """Run one transmission; returns the connections it received and sent on."""
        self.thread = thread
        clock = thread.clock
        preds: list[int] = []
        for wait in instr.waits:
            target = self.by_tb[(thread.gpu, wait.tb)]
            number = target.published_numbers[bisect.bisect_left(target.published_numbers, wait.step)]
            published = target.published[number]
            np.maximum(clock, published.clock, out=clock)
            preds.append(published.event)
            left = target.awaited[number] - 1
            if left:
                target.awaited[number] = left
            else:
                del target.awaited[number], target.published[number]
        message: _Message | None = None
        received_on: Connection | None = None
        if instr.steps[0].type in RECEIVING:
            received_on = thread.receives_on
            message = self.fifos[received_on].popleft()
            preds.append(message.event)
        # The clock's own entry is not kept up to date: it is thread.pc, written into the
        # copies a publication keeps (no other reader looks at it).
        self.start, self.room = self.mem.start[thread.gpu], self.mem.room[thread.gpu]
        event = self.event = len(self.ev_thread)
        self.ev_thread.append(thread.index)
        self.ev_pc.append(thread.pc)
        self.ev_preds.append(tuple(preds) if preds else None)
        thread.events.append(event)
        sent_on: Connection | None = None
        for step in instr.steps:
            self.current = step
            outgoing = self.step(step, message)
            if outgoing is not None:
                sent_on = thread.sends_on
                fifo = self.fifos.get(sent_on)
                if fifo is None:
                    fifo = self.fifos[sent_on] = deque()
                fifo.append(_Message(outgoing, event, thread.index, step))
        return received_on, sent_on

    # -- step semantics -----------------------------------------------------------------------
    def step(self, step: XmlStep, message: _Message | None) -> list | None:
        """Apply one step to memory; returns the values it sends, if it sends."""
        t, n = step.type, step.cnt
        incoming: list = []
        if t in RECEIVING:
            assert message is not None
            incoming = message.values
            if len(incoming) != n:
                sender = StepRef.of(self.refs[message.sender][0], self.refs[message.sender][1], message.step)
                self.report(Issue(
                    IssueKind.COUNT_MISMATCH,
                    f"{self.ref} receives {n} chunk(s), but the message it takes ({sender}) carries "
                    f"{len(incoming)}", self.ref))
                incoming = (list(incoming) + [POISON] * n)[:n]
        if t is StepType.SEND:
            return self.read_all(step.srcbuf, step.srcoff, n)
        if t is StepType.RECV:
            self.write_all(step.dstbuf, step.dstoff, incoming)
            return None
        if t is StepType.RECV_COPY_SEND:
            self.write_all(step.dstbuf, step.dstoff, incoming)
            return incoming
        if t is StepType.COPY:
            self.write_all(step.dstbuf, step.dstoff, self.read_all(step.srcbuf, step.srcoff, n))
            return None
        if t is StepType.REDUCE:  # slot by slot, as messages about them should come
            dst, src = self.base(step.dstbuf, step.dstoff, n), self.base(step.srcbuf, step.srcoff, n)
            sums = [self.reduce(self.read(step.dstbuf, step.dstoff + i, dst + i),  # type: ignore[arg-type]
                                self.read(step.srcbuf, step.srcoff + i, src + i)) for i in range(n)]  # type: ignore[arg-type]
            self.write_all(step.dstbuf, step.dstoff, sums)
            return None
        if t.reduces:  # rrs, rrc, rrcs: the message reduced with src
            src = self.base(step.srcbuf, step.srcoff, n)
            sums = [self.reduce(incoming[i], self.read(step.srcbuf, step.srcoff + i, src + i))  # type: ignore[arg-type]
                    for i in range(n)]
            if t is not StepType.RECV_REDUCE_SEND:
                self.write_all(step.dstbuf, step.dstoff, sums)
            return sums if t.sends else None
        return None  # nop

    def reduce(self, a: Code | None | _Poison, b: Code | None | _Poison) -> Code | _Poison:
        if a is POISON or b is POISON or a is None or b is None:
            return POISON
        total, twice = self.codec.combine(a, b)  # type: ignore[arg-type]
        if twice is not None:
            self.report(Issue(
                IssueKind.DOUBLE_COUNT,
                f"{self.ref} reduces {self.show(a)} with {self.show(b)}, counting {self.show(twice)} twice",
                self.ref))
        return total

    def base(self, buffer: BufferName | None, offset: int, n: int) -> int:
        """The slot of `buffer[offset]` on the current GPU, after checking n slots fit (the
        structural checks make sure of it; this keeps the flat list from being read or
        resized past a buffer)."""
        if offset < 0 or offset + n > self.room[buffer]:  # type: ignore[index]
            raise IndexError(f"{buffer}[{offset}..{offset + n - 1}] of GPU {self.thread.gpu} is outside its "  # type: ignore[union-attr]
                             "buffer")
        return self.start[buffer] + offset  # type: ignore[index]

    def read_all(self, buffer: BufferName | None, offset: int, n: int) -> list:
        """The values of n slots from `offset`, each checked as `read` checks one."""
        base = self.base(buffer, offset, n)
        values = self.values[base:base + n]
        if self.check_races:  # `check_read` and `read`, inline: once per slot of every step
            thread = self.thread
            assert thread is not None and buffer is not None
            me, writers, reads, raced = thread.index, self.writers, self.reads, self.raced
            access = (me, self.event, self.current)
            for i in range(n):
                slot = base + i
                write = writers[slot]
                # a slot that raced is reported once: no need to ask again
                if write is not None and write[0] != me and slot not in raced and not self.ordered(write):
                    self.report_race(slot, buffer, offset + i, write, "writes", "reads")
                readers = reads.get(slot)
                if readers is None:
                    reads[slot] = {me: access}  # type: ignore[dict-item]
                else:
                    readers[me] = access  # type: ignore[assignment]
                if values[i] is None:
                    values[i] = self.unwritten(buffer, offset + i)
        elif None in values:
            for i in range(n):
                if values[i] is None:
                    values[i] = self.unwritten(buffer, offset + i)  # type: ignore[arg-type]
        return values

    def read(self, buffer: BufferName, index: int, slot: int) -> "Code | _Poison":
        if self.check_races:
            self.check_read(slot, buffer, index)
        value = self.values[slot]
        if value is None:
            return self.unwritten(buffer, index)
        return value

    def unwritten(self, buffer: BufferName, index: int) -> _Poison:
        assert self.thread is not None
        self.report(Issue(
            IssueKind.UNWRITTEN_READ,
            f"{self.ref} reads {BUFFER_WORDS[buffer]}[{index}] of GPU {self.thread.gpu}, which nothing has "
            "written before this step", self.ref))
        return POISON

    def write_all(self, buffer: BufferName | None, offset: int, values: list) -> None:
        n = len(values)
        base = self.base(buffer, offset, n)
        thread = self.thread
        assert thread is not None
        access: Access = (thread.index, self.event, self.current)  # type: ignore[assignment]
        if self.check_races:  # `check_write`, inline
            me, writers, reads, raced = thread.index, self.writers, self.reads, self.raced
            for i in range(n):
                slot = base + i
                write = writers[slot]
                if write is not None and write[0] != me and slot not in raced and not self.ordered(write):
                    self.report_race(slot, buffer, offset + i, write, "writes", "writes")  # type: ignore[arg-type]
                readers = reads.pop(slot, None)
                if readers and slot not in raced:
                    for read in readers.values():
                        if read[0] != me and not self.ordered(read):
                            self.report_race(slot, buffer, offset + i, read, "reads", "writes")  # type: ignore[arg-type]
                            break
        self.values[base:base + n] = values
        self.writers[base:base + n] = [access] * n

    # -- races -------------------------------------------------------------------------------------
    def ordered(self, earlier: Access) -> bool:
        """Whether `earlier` (by a threadblock of this GPU) happens before the current event."""
        thread = self.thread
        assert thread is not None
        x = earlier[0]
        if x == thread.index:
            return True
        local = x - thread.first
        pc = self.ev_pc[earlier[1]]
        if thread.clock[local] > pc:
            return True
        return self.search(x, earlier[1])

    def search(self, x: int, a: int) -> bool:
        """Whether an event of threadblock x at or after event a precedes the current event
        (see above); raises the current threadblock's local clock with what it passes.

        A search that finds nothing has seen every event at or above its bound that
        precedes the current one. Per threadblock that set is kept as its last event per
        threadblock (`memos`): the events of one threadblock that precede are a prefix of
        its events. A later search from the same threadblock with a bound at least as high
        starts from it: it answers at once when x's last known event is recent enough, and
        otherwise searches only what is new. Without it a file with races everywhere asks
        the same question over the same events once per slot."""
        thread = self.thread
        assert thread is not None
        ev_thread, ev_pc, ev_preds = self.ev_thread, self.ev_pc, self.ev_preds
        threads = self.threads
        memo = self.memos.get(thread.index)
        if memo is not None and a >= memo[0]:
            bound, latest = memo
            if latest.get(x, -1) >= a:
                self.raise_clock(thread, (latest[x],))
                return True
        else:
            bound, latest = a, {}
        stack = [self.event]
        seen = {self.event}
        found = False
        while stack and not found:
            e = stack.pop()
            t, pc = ev_thread[e], ev_pc[e]
            preds = ev_preds[e]
            candidates = [threads[t].events[pc - 1]] if pc > 0 else []
            if preds:
                candidates.extend(preds)
            for p in candidates:
                if p < bound or p in seen:
                    continue
                tp = ev_thread[p]
                if p <= latest.get(tp, -1):  # known to precede, with all it follows at or above the bound
                    continue
                seen.add(p)
                if tp == x and p >= a:
                    found = True
                    break
                stack.append(p)
        self.raise_clock(thread, seen)
        if not found:  # complete: keep it
            if memo is None or memo[1] is not latest:
                if memo is not None:
                    self.memo_entries -= len(memo[1])
                self.memos[thread.index] = (bound, latest)
            before = len(latest)
            for e in seen:
                t = ev_thread[e]
                if latest.get(t, -1) < e:
                    latest[t] = e
            self.memo_entries += len(latest) - before
            if self.memo_entries > MEMO_ENTRIES:  # a bound on memory: start afresh
                self.memos.clear()
                self.memo_entries = 0
        return found

    def raise_clock(self, thread: _Thread, events: Iterable[int]) -> None:
        """Every event in `events` precedes the current one: raise the local clock."""
        first, count, clock = thread.first, len(thread.clock), thread.clock
        ev_thread, ev_pc = self.ev_thread, self.ev_pc
        for e in events:
            local = ev_thread[e] - first
            if 0 <= local < count and clock[local] <= ev_pc[e]:
                clock[local] = ev_pc[e] + 1

    def check_read(self, slot: int, buffer: BufferName, index: int) -> None:
        thread = self.thread
        assert thread is not None
        write = self.writers[slot]
        if write is not None and slot not in self.raced and not self.ordered(write):
            self.report_race(slot, buffer, index, write, "writes", "reads")
        reads = self.reads.get(slot)
        if reads is None:
            reads = self.reads[slot] = {}
        reads[thread.index] = (thread.index, self.event, self.current)  # type: ignore[assignment]

    def report_race(self, slot: int, buffer: BufferName, index: int, other: Access, other_does: str,
                    this_does: str) -> None:
        assert self.thread is not None
        if other[0] == self.thread.index or slot in self.raced:
            return
        self.raced.add(slot)
        other_ref = self.access_ref(other)
        notes = [f"{other_ref} is at line {other_ref.line}"] if other_ref.line else []
        rank = self.thread.gpu
        physical, i = self.mem.where(slot)
        if (physical, i) != (buffer, index):
            notes.append(f"in this arrangement {BUFFER_WORDS[buffer]}[{index}] is {BUFFER_WORDS[physical]}[{i}] "
                         "of the same GPU (in-place buffers overlap)")
        self.report(Issue(
            IssueKind.RACE,
            f"race on {BUFFER_WORDS[buffer]}[{index}] of GPU {rank}: {self.ref} {this_does} it and "
            f"{other_ref} {other_does} it, and no dependency or message orders the two", self.ref,
            notes=tuple(notes)))

    # -- the end ----------------------------------------------------------------------------------
    def report_unreceived(self) -> None:
        for (src, dst, chan), fifo in sorted(self.fifos.items()):
            if fifo:
                first = fifo[0]
                sender = self.access_ref((first.sender, first.event, first.step))
                self.report(Issue(
                    IssueKind.UNRECEIVED,
                    f"{sender} sends to GPU {dst} on channel {chan}, but no step of GPU {dst} receives it "
                    f"({len(fifo)} message(s) left on that connection)", sender))

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


def simulate(algo: XmlAlgo, layouts: Sequence[RankLayout], inputs: Sequence[Sequence[Value]] | None = None, *,
             programs: Sequence[Sequence[ThreadblockProgram]] | None = None, max_issues: int = 50,
             check_races: bool = True, fifo_capacity: int | None = None,
             input_chunks: Sequence[int] | None = None) -> SimulationResult:
    """Run `algo` with rank r's input slot i holding `inputs[r][i]` (or, given
    `input_chunks` instead, chunk(r, i) for i < input_chunks[r]: no sets built) and memory
    laid out as `layouts[r]`. The program must be structurally valid (`verify_algo` checks that first):
    peers, offsets and dependencies in range, one threadblock per connection end.

    `fifo_capacity` bounds the messages a connection holds (a send then waits for the
    receiver); None leaves FIFOs unbounded, the reading of the XML format itself."""
    if (inputs is None) == (input_chunks is None):
        raise ValueError("give inputs or input_chunks")
    return Simulator(algo, layouts, inputs, programs, max_issues=max_issues, check_races=check_races,
                     fifo_capacity=fifo_capacity, input_chunks=input_chunks).run()
