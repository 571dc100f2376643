"""`collc verify`: check an MSCCL XML program against the runtimes' rules and its collective.

Three layers, each reporting located messages (`file:line`, GPU, threadblock, step):

1. Structure: the rules the executor's parser enforces or silently relies on: GPU and
   threadblock ids, peers, channels, step numbering, buffer
   bounds, dependencies, per-threadblock and per-file limits, and that every connection
   (sender GPU, receiver GPU, channel) has exactly one sending and one receiving
   threadblock whose send and receive steps pair up one to one with equal counts.
2. Execution: the symbolic executor of `simulate.py` (deadlocks, reads of unwritten
   slots, double counts, races).
3. The postcondition of the collective the file claims, for every buffer arrangement it
   claims (in-place, out-of-place or both).

Chunk granularity, following the executor (`mscclSetupKernel` divides
`count x sizeMultiplier` by `nchunksperloop`, and sizeMultiplier is ngpus for AllGather,
ReduceScatter and AllToAll, 1 otherwise), with k the chunks each rank contributes:

| coll | k | input chunks | output chunks |
|---|---|---|---|
| allgather | nchunksperloop / ngpus | k | ngpus x k |
| reducescatter | nchunksperloop / ngpus | ngpus x k | k |
| alltoall, allreduce | nchunksperloop / ngpus | ngpus x k | ngpus x k |
| broadcast, reduce | nchunksperloop | k | k |
| gather | nchunksperloop | k | ngpus x k |
| scatter | nchunksperloop | ngpus x k | k |

(allreduce with nchunksperloop not divisible by ngpus is checked slot by slot all the
same.) In-place means what the executor's selection tests (`mscclSchedulerSelectAlgo` /
`mscclEnqueueCheck`): for reduce, broadcast, allreduce and alltoall the input is the
output buffer; for allgather and gather rank r's input is the output window starting at
r x k; for reducescatter and scatter rank r's output is the input window starting at
r x k. Out-of-place files get separate buffers, the output starting empty.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from collc.backends.msccl_xml.limits import threadblock_excess
from collc.backends.msccl_xml.model import BufferName, StepType, XmlAlgo, XmlGpu, XmlStep, XmlThreadblock
from collc.backends.msccl_xml.reader import XmlDocument, read_xml_document
from collc.backends.msccl_xml.simulate import (
    BUFFER_WORDS,
    POISON,
    RECEIVING,
    SENDING,
    ChunkCodec,
    Code,
    Issue,
    RankLayout,
    Severity,
    SimulationResult,
    StepRef,
    ThreadblockProgram,
    compile_threadblock,
    simulate,
)
from collc.diagnostics import CollcError, ScheduleError, Span, format_error, read_input_bytes
from collc.ir.collective import ChunkId, Collective, CollectiveKind, Value, standard, value_str
from collc.ir.heap import few_collections

# Limits of the current MSCCL executor (msccl_struct.h, NCCL's MAXCHANNELS, msccl_parser.cc).
MAX_CHANNELS = 32
MAX_TBS_PER_CHANNEL = 32
MAX_COUNT = 72  # cnt must stay below this
MAX_XML_NODES = 4096  # counted per rank: <algo>, every <gpu>, and that rank's <tb>s and <step>s
MAX_STEPS_CURRENT = 64
MAX_STEPS_OLD_RUNTIME = 256


class Runtime(str, Enum):
    """The runtime a file is judged against.

    `current`: NCCL's MSCCL executor (Azure/msccl-executor-nccl) and RCCL's MSCCL, which
    skip a file without minBytes/maxBytes/outofplace or with an older collective name
    (NCCL then silently runs its own algorithm) and run at most 64 steps per threadblock.
    `legacy`: the older research runtime (microsoft/msccl), which knows none of those
    attributes and runs up to 256 steps per threadblock."""

    CURRENT = "current"
    LEGACY = "legacy"

    @property
    def max_steps(self) -> int:
        return MAX_STEPS_CURRENT if self is Runtime.CURRENT else MAX_STEPS_OLD_RUNTIME

EXECUTOR_COLLECTIVES = frozenset({"reduce", "broadcast", "allreduce", "reducescatter", "allgather", "send",
                                  "recv", "gather", "scatter", "alltoall", "alltoallv"})
# Spellings of the older research runtime (microsoft/msccl) and what they mean now.
OLD_RUNTIME_COLLECTIVES = {"reduce_scatter": "reducescatter", "custom": "custom"}
ROOTED = (CollectiveKind.BROADCAST, CollectiveKind.REDUCE, CollectiveKind.GATHER, CollectiveKind.SCATTER)
PER_RANK_SHARE = (CollectiveKind.ALLGATHER, CollectiveKind.REDUCESCATTER, CollectiveKind.ALLTOALL,
                  CollectiveKind.ALLREDUCE)

IN_PLACE = "in-place"
OUT_OF_PLACE = "out-of-place"


class XmlVerifyError(ScheduleError):
    """A located problem in an MSCCL XML program; `where` names the step when there is one."""

    def __init__(self, message: str, span: Span | None = None, notes: Iterable[str] = (), *,
                 where: StepRef | None = None, kind: str = ""):
        super().__init__(message, span, tuple(notes))
        self.where = where
        self.kind = kind


@dataclass(frozen=True)
class VerifyStats:
    coll: str
    gpus: int
    tbs: int
    steps: int
    channels: int
    modes: tuple[str, ...] = ()
    chunks_per_rank: int | None = None
    root: int | None = None


@dataclass
class VerifyReport:
    source: str
    stats: VerifyStats | None  # None when the file could not be read
    errors: list[CollcError] = field(default_factory=list)
    warnings: list[CollcError] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors

    def summary(self) -> str:
        """`ok (allgather, 8 GPUs, 56 tbs, 392 steps)` or `FAILED (3 errors)`."""
        if self.ok and self.stats is not None:
            s = self.stats
            return f"ok ({s.coll}, {s.gpus} GPUs, {s.tbs} tbs, {s.steps} steps)"
        return f"FAILED ({len(self.errors)} error{'s' if len(self.errors) != 1 else ''})"

    def render(self, *, warnings: bool = True) -> str:
        """What the CLI prints for one file: the summary line, then each error (with its
        source line and caret) and each warning."""
        lines = [f"{self.source}: {self.summary()}"]
        try:  # read once, not once per message
            sources = {self.source: read_input_bytes(self.source).decode("utf-8", errors="replace")}
        except OSError:
            sources = {}
        lines.extend(format_error(e, sources) for e in self.errors)
        if warnings:
            lines.extend(_format_warning(w, sources) for w in self.warnings)
        return "\n".join(lines)


def _format_warning(w: CollcError, sources: dict[str, str]) -> str:
    text = format_error(w, sources)
    head = f"{w.span}: error: " if w.span else "collc: error: "
    return text.replace(head, f"{w.span}: warning: " if w.span else "collc: warning: ", 1)


# --- entry points -----------------------------------------------------------------------------

def verify_file(path: Path, **kw: Any) -> VerifyReport:
    """Verify one file. Raises `CollcError` (with a Span) when it cannot be read or is not
    well-formed MSCCL XML; every other problem is in the report."""
    with few_collections():  # a large file is millions of small objects kept to the end
        return verify_document(read_xml_document(Path(path)), **kw)


def verify_files(paths: Iterable[Path], **kw: Any) -> list[VerifyReport]:
    """Verify each file; an unreadable or malformed one gets a report holding that error."""
    reports = []
    for path in paths:
        try:
            reports.append(verify_file(path, **kw))
        except CollcError as err:
            reports.append(VerifyReport(str(path), None, [err]))
    return reports


def verify_document(doc: XmlDocument, **kw: Any) -> VerifyReport:
    """Verify a read file (keywords as for `verify_algo`); messages point at the element
    they are about."""
    report = verify_algo(doc.algo, source=doc.path, algo_line=doc.algo_line, **kw)
    for err in report.errors + report.warnings:
        if err.span is not None and err.span.file == doc.path:
            err.span = doc.span(err.span.line)
    report.warnings[:0] = doc.warnings
    return report


def verify_algo(algo: XmlAlgo, *, max_steps: int | None = None, strict: bool = False,
                runtime: Runtime | str = Runtime.CURRENT, sms: int | None = None,
                source: str = "<xml>", algo_line: int = 1, max_errors: int = 50,
                check_races: bool = True, fifo_capacity: int | None = None) -> VerifyReport:
    """Check structure, run the program symbolically and check the collective's
    postcondition in every buffer arrangement the file claims.

    `runtime` is what the file must run on (`Runtime`): under `current` what makes the
    executor skip the file (missing minBytes/maxBytes/outofplace, old collective names)
    is an error, under `legacy` a warning (`strict` makes it an error there too).
    `max_steps` is the per-threadblock step limit (default: the runtime's, 64 or 256).
    `sms`: the GPUs' SM count; a GPU with more threadblocks than can be resident at once
    (`limits.resident_threadblocks`) is an error.
    `check_races` reports accesses to one slot that nothing orders; `fifo_capacity`
    bounds the messages in flight per connection (None: unbounded), to find programs
    that only finish if a connection buffers that many messages."""
    runtime = Runtime(runtime)
    v = _Verifier(algo, source, algo_line, max_steps=runtime.max_steps if max_steps is None else max_steps,
                  strict=strict or runtime is Runtime.CURRENT, max_errors=max_errors,
                  check_races=check_races, fifo_capacity=fifo_capacity, sms=sms)
    v.run()
    return VerifyReport(source, v.stats(), v.errors, v.warnings)


# --- the expected collective ------------------------------------------------------------------

def collective_kind(coll: str) -> CollectiveKind | None:
    """The modelled collective a `coll` attribute names (old spellings included), or None."""
    name = OLD_RUNTIME_COLLECTIVES.get(coll, coll)
    try:
        kind = CollectiveKind(name)
    except ValueError:
        return None
    return None if kind is CollectiveKind.CUSTOM else kind


def chunks_per_rank(kind: CollectiveKind, ngpus: int, nchunksperloop: int) -> int | None:
    """k, the chunks each rank contributes, or None when nchunksperloop does not split."""
    if kind in PER_RANK_SHARE:
        return nchunksperloop // ngpus if nchunksperloop % ngpus == 0 else None
    return nchunksperloop


def expected_collective(kind: CollectiveKind, ngpus: int, nchunksperloop: int, root: int = 0) -> Collective:
    """The collective a file with this `coll`, `ngpus` and `nchunksperloop` computes."""
    k = chunks_per_rank(kind, ngpus, nchunksperloop)
    if k is None and kind is CollectiveKind.ALLREDUCE:
        return _allreduce_slots(ngpus, nchunksperloop)
    if k is None:
        raise ValueError(f"{kind.value} needs nchunksperloop divisible by ngpus")
    return standard(kind, ngpus, k, root)


@dataclass(frozen=True)
class ExpectedCollective:
    """What a file's collective needs, in the simulator's encoding (`ChunkCodec`): built
    without sets of ChunkIds (an AllReduce on 1,024 ranks as a `Collective` is a million
    frozensets, 3 s and 450 MiB). Inputs are chunk(r, i) for i < in_chunks[r]; equal
    output rows are one shared list."""

    kind: CollectiveKind
    ranks: int
    in_chunks: Sequence[int]
    outputs: Sequence[Sequence[Code | None]]

    def out_chunks(self, rank: int) -> int:
        return len(self.outputs[rank])


def expected_codes(kind: CollectiveKind, ngpus: int, nchunksperloop: int, root: int = 0) -> ExpectedCollective:
    """`expected_collective`, encoded; the two agree slot for slot (tests check it)."""
    R = ngpus
    codec = ChunkCodec(R)
    chunk, total = codec.chunk, codec.sum_over_ranks
    k = chunks_per_rank(kind, ngpus, nchunksperloop)
    if k is None:
        if kind is not CollectiveKind.ALLREDUCE:
            raise ValueError(f"{kind.value} needs nchunksperloop divisible by ngpus")
        row: list[Code | None] = [total(R, j) for j in range(nchunksperloop)]
        return ExpectedCollective(kind, R, [nchunksperloop] * R, [row] * R)
    outputs: list[Sequence[Code | None]]
    if kind is CollectiveKind.ALLGATHER:
        ins, row = k, [chunk(s, i) for s in range(R) for i in range(k)]
        outputs = [row] * R
    elif kind is CollectiveKind.REDUCESCATTER:
        ins, outputs = R * k, [[total(R, r * k + i) for i in range(k)] for r in range(R)]
    elif kind is CollectiveKind.ALLREDUCE:
        ins, row = R * k, [total(R, j) for j in range(R * k)]
        outputs = [row] * R
    elif kind is CollectiveKind.ALLTOALL:
        ins, outputs = R * k, [[chunk(s, r * k + i) for s in range(R) for i in range(k)] for r in range(R)]
    elif kind is CollectiveKind.BROADCAST:
        ins, row = k, [chunk(root, i) for i in range(k)]
        outputs = [row] * R
    elif kind is CollectiveKind.REDUCE:
        ins, empty = k, [None] * k
        outputs = [[total(R, i) for i in range(k)] if r == root else empty for r in range(R)]
    elif kind is CollectiveKind.GATHER:
        ins, empty = k, [None] * (R * k)
        full = [chunk(s, i) for s in range(R) for i in range(k)]
        outputs = [full if r == root else empty for r in range(R)]
    elif kind is CollectiveKind.SCATTER:
        ins, outputs = R * k, [[chunk(root, r * k + i) for i in range(k)] for r in range(R)]
    else:
        raise ValueError(f"no postcondition for {kind.value}")
    return ExpectedCollective(kind, R, [ins] * R, outputs)


def _allreduce_slots(ranks: int, slots: int) -> Collective:
    inputs = tuple(tuple(frozenset({ChunkId(r, i)}) for i in range(slots)) for r in range(ranks))
    outputs = tuple(tuple(frozenset(ChunkId(s, j) for s in range(ranks)) for j in range(slots))
                    for _ in range(ranks))
    return Collective("allreduce", CollectiveKind.ALLREDUCE, ranks, slots, inputs, outputs)


def rank_layout(kind: CollectiveKind | None, in_place: bool, rank: int, in_chunks: int, out_chunks: int,
                scratch_chunks: int) -> RankLayout:
    """Where rank `rank`'s input, output and scratch buffers sit (see the module doc)."""
    if not in_place:
        return RankLayout.separate(in_chunks, out_chunks, scratch_chunks)
    i, o, s = BufferName.INPUT, BufferName.OUTPUT, BufferName.SCRATCH
    if kind in (CollectiveKind.ALLGATHER, CollectiveKind.GATHER):
        return RankLayout({o: out_chunks, s: scratch_chunks}, {i: (o, rank * in_chunks), o: (o, 0), s: (s, 0)})
    if kind in (CollectiveKind.REDUCESCATTER, CollectiveKind.SCATTER):
        return RankLayout({i: in_chunks, s: scratch_chunks}, {i: (i, 0), o: (i, rank * out_chunks), s: (s, 0)})
    return RankLayout({i: max(in_chunks, out_chunks), s: scratch_chunks}, {i: (i, 0), o: (i, 0), s: (s, 0)})


# --- the checks --------------------------------------------------------------------------------

def _operands(step: XmlStep) -> list[tuple[str, BufferName | None, int]]:
    """The buffer operands a step uses (the executor ignores the others)."""
    t = step.type
    src = ("src", step.srcbuf, step.srcoff)
    dst = ("dst", step.dstbuf, step.dstoff)
    if t is StepType.NOP:
        return []
    if t is StepType.SEND or t is StepType.RECV_REDUCE_SEND:
        return [src]
    if t is StepType.RECV or t is StepType.RECV_COPY_SEND:
        return [dst]
    return [src, dst]


class _Verifier:
    def __init__(self, algo: XmlAlgo, source: str, algo_line: int, *, max_steps: int, strict: bool,
                 max_errors: int, check_races: bool, fifo_capacity: int | None, sms: int | None = None):
        self.algo = algo
        self.sms = sms
        self.source = source
        self.algo_line = algo_line
        self.max_steps = max_steps
        self.strict = strict
        self.max_errors = max_errors
        self.check_races = check_races
        self.fifo_capacity = fifo_capacity
        self.errors: list[CollcError] = []
        self.warnings: list[CollcError] = []
        self.blocking = False  # a structural error the simulation cannot run past
        self.kind: CollectiveKind | None = None
        self.k: int | None = None
        self.modes: tuple[str, ...] = ()
        self.root: int | None = None
        self.programs: list[list[ThreadblockProgram]] = []
        self._collective: tuple[tuple[CollectiveKind, int | None], ExpectedCollective] | None = None
        self._sizes: tuple[XmlGpu | None, dict[BufferName, tuple[str, int]]] = (None, {})

    # -- reporting -----------------------------------------------------------------------
    def span(self, line: int | None) -> Span:
        return Span(self.source, line if line is not None else self.algo_line, 1)

    def error(self, message: str, line: int | None = None, *, where: StepRef | None = None, kind: str = "",
              blocking: bool = False, notes: Iterable[str] = ()) -> None:
        self.blocking |= blocking
        if len(self.errors) < self.max_errors:
            self.errors.append(XmlVerifyError(message, self.span(line), notes, where=where, kind=kind))
        elif len(self.errors) == self.max_errors:
            self.errors.append(XmlVerifyError(f"more errors follow; showing the first {self.max_errors}",
                                              self.span(None), kind="truncated"))

    def warning(self, message: str, line: int | None = None, *, where: StepRef | None = None,
                kind: str = "") -> None:
        self.warnings.append(XmlVerifyError(message, self.span(line), where=where, kind=kind))

    def compat(self, message: str, line: int | None = None, *, kind: str) -> None:
        """A problem that makes the current executor skip the file without running it."""
        (self.error if self.strict else self.warning)(message, line, kind=kind)

    def stats(self) -> VerifyStats:
        gpus = self.algo.gpus
        return VerifyStats(
            coll=self.kind.value if self.kind else self.algo.coll,
            gpus=len(gpus),
            tbs=sum(len(g.tbs) for g in gpus),
            steps=sum(len(tb.steps) for g in gpus for tb in g.tbs),
            channels=len({tb.chan for g in gpus for tb in g.tbs}),
            modes=self.modes,
            chunks_per_rank=self.k,
            root=self.root,
        )

    # -- driver ----------------------------------------------------------------------------
    def run(self) -> None:
        self.check_header()
        gpus = self.check_gpu_ids()
        if gpus is None:
            return
        self.check_sizes(gpus)
        for gpu in gpus:
            self.check_gpu(gpu)
        self.programs = [[compile_threadblock(g.id, tb) for tb in g.tbs] for g in gpus]
        for program in (p for per_gpu in self.programs for p in per_gpu):
            for note in program.notes:
                if note.severity is Severity.ERROR:
                    self.error(note.message, note.where.line if note.where else None, where=note.where,
                               kind=note.kind.value)
                else:
                    self.warning(note.message, note.where.line if note.where else None, where=note.where,
                                 kind=note.kind.value)
        self.check_connections(gpus)
        if self.blocking:
            return
        self.execute(gpus)

    # -- 1. structure ------------------------------------------------------------------------
    def check_header(self) -> None:
        a = self.algo
        coll = a.coll
        if coll in OLD_RUNTIME_COLLECTIVES:
            self.compat(f"coll=\"{coll}\" is the older runtime's spelling; the current executor only knows "
                        f"{', '.join(sorted(EXECUTOR_COLLECTIVES))} and skips this file", kind="old-collective")
        elif coll not in EXECUTOR_COLLECTIVES:
            self.error(f"coll=\"{coll}\" is not a collective the executor runs (known: "
                       f"{', '.join(sorted(EXECUTOR_COLLECTIVES))})", kind="unknown-collective")
        self.kind = collective_kind(coll)
        if self.kind is None and coll in EXECUTOR_COLLECTIVES | set(OLD_RUNTIME_COLLECTIVES):
            self.warning(f"collc has no postcondition for coll=\"{coll}\"; only structure and execution "
                         "(deadlocks, unwritten reads, races) are checked", kind="no-postcondition")
        for attr, value in (("minBytes", a.min_bytes), ("maxBytes", a.max_bytes), ("outofplace", a.outofplace)):
            if value is None:
                self.compat(f"<algo> has no {attr}; the current executor requires it and silently skips this "
                            "file (NCCL then runs its own algorithm)", kind="missing-attribute")
        if a.min_bytes is not None and a.max_bytes not in (None, 0) and a.max_bytes < a.min_bytes:
            self.compat(f"maxBytes={a.max_bytes} is below minBytes={a.min_bytes}: no size selects this file",
                        kind="empty-size-range")
        # The older runtime had no outofplace attribute: a file was in-place or not.
        outofplace = a.outofplace if a.outofplace is not None else not a.inplace
        self.modes = tuple(m for m, on in ((IN_PLACE, a.inplace), (OUT_OF_PLACE, outofplace)) if on)
        if not self.modes:
            self.error("inplace=\"0\" and outofplace=\"0\": the executor never selects this file",
                       kind="never-selected")
        if a.nchannels > MAX_CHANNELS:
            self.error(f"nchannels={a.nchannels}, but the executor has at most {MAX_CHANNELS} channels",
                       kind="limit")
        if self.kind is not None:
            self.k = chunks_per_rank(self.kind, a.ngpus, a.nchunksperloop)
            if self.k is None and self.kind is not CollectiveKind.ALLREDUCE:
                self.error(f"nchunksperloop={a.nchunksperloop} is not a multiple of ngpus={a.ngpus}, so "
                           f"{self.kind.value} has no whole number of chunks per rank", kind="granularity",
                           blocking=True)
        root = a.extra_attrs.get("root")
        if root is not None and self.kind in ROOTED:
            if not root.strip().lstrip("+-").isdigit() or not 0 <= int(root) < a.ngpus:
                self.error(f"root=\"{root}\" is not a rank in 0..{a.ngpus - 1}", kind="root", blocking=True)
            else:
                self.root = int(root)

    def check_gpu_ids(self) -> list[XmlGpu] | None:
        """The GPUs in rank order, or None when they cannot be matched to ranks."""
        a = self.algo
        by_id: dict[int, XmlGpu] = {}
        for gpu in a.gpus:
            if gpu.id >= a.ngpus:
                self.error(f"<gpu id=\"{gpu.id}\"> is out of range: ngpus={a.ngpus}", gpu.line, kind="gpu-id",
                           blocking=True)
            elif gpu.id in by_id:
                self.error(f"GPU {gpu.id} appears twice (first at line {by_id[gpu.id].line})", gpu.line,
                           kind="gpu-id", blocking=True)
            else:
                by_id[gpu.id] = gpu
        missing = [r for r in range(a.ngpus) if r not in by_id]
        if missing:
            self.error(f"ngpus={a.ngpus} but the file has no <gpu> for rank{'s' if len(missing) > 1 else ''} "
                       f"{', '.join(map(str, missing[:10]))}{', ...' if len(missing) > 10 else ''}",
                       kind="gpu-id", blocking=True)
        if self.blocking:
            return None
        return [by_id[r] for r in range(a.ngpus)]

    def collective(self) -> ExpectedCollective | None:
        """The collective the file claims (with the root named or inferred so far), when
        collc models it."""
        if self.kind is None or (self.k is None and self.kind is not CollectiveKind.ALLREDUCE):
            return None
        key = (self.kind, self.root)
        if self._collective is None or self._collective[0] != key:
            a = self.algo
            self._collective = (key, expected_codes(self.kind, a.ngpus, a.nchunksperloop, self.root or 0))
        return self._collective[1]

    def check_sizes(self, gpus: list[XmlGpu]) -> None:
        coll = self.collective()
        if coll is None:
            return
        for gpu in gpus:
            sizes = coll.in_chunks[gpu.id], coll.out_chunks(gpu.id)
            for attr, declared, real, word in (("i_chunks", gpu.i_chunks, sizes[0], "input"),
                                               ("o_chunks", gpu.o_chunks, sizes[1], "output")):
                if declared > real:
                    self.error(f"GPU {gpu.id} declares {attr}={declared}, but the {self.kind.value} {word} buffer "  # type: ignore[union-attr]
                               f"holds {real} chunks (nchunksperloop={self.algo.nchunksperloop}, "
                               f"ngpus={self.algo.ngpus}); steps up to {attr} would run past it", gpu.line,
                               kind="buffer-size", blocking=True)

    def check_gpu(self, gpu: XmlGpu) -> None:
        a = self.algo
        ids = [tb.id for tb in gpu.tbs]
        seen: dict[int, XmlThreadblock] = {}
        for tb in gpu.tbs:
            if tb.id in seen:
                self.error(f"GPU {gpu.id} has two threadblocks with id {tb.id} (lines {seen[tb.id].line} and "
                           f"{tb.line})", tb.line, kind="tb-id", blocking=True)
            seen[tb.id] = tb
        missing = sorted(set(range(len(ids))) - set(ids))
        if missing:
            self.error(f"GPU {gpu.id}: threadblock ids must run 0..{len(ids) - 1} without gaps; tb {missing[0]} "
                       "is missing (the executor rejects the file)", gpu.line, kind="tb-id", blocking=True)
        nodes = 1 + a.ngpus + len(gpu.tbs) + sum(len(tb.steps) for tb in gpu.tbs)
        if nodes > MAX_XML_NODES:
            self.error(f"GPU {gpu.id} needs {nodes} XML nodes (<algo>, {a.ngpus} <gpu>, its <tb>s and <step>s); "
                       f"the executor's parser holds at most {MAX_XML_NODES}", gpu.line, kind="limit")
        per_channel: dict[int, int] = {}
        for tb in gpu.tbs:
            per_channel[tb.chan] = per_channel.get(tb.chan, 0) + 1
            self.check_threadblock(gpu, tb, seen)
        for chan, n in sorted(per_channel.items()):
            if n > MAX_TBS_PER_CHANNEL:
                self.error(f"GPU {gpu.id} has {n} threadblocks on channel {chan}; the executor allows "
                           f"{MAX_TBS_PER_CHANNEL} per channel", gpu.line, kind="limit")
        excess = threadblock_excess(len(gpu.tbs), self.sms) if self.sms else None
        if excess is not None:
            self.error(f"GPU {gpu.id} has {excess} (--sms {self.sms})", gpu.line, kind="resident")

    def check_threadblock(self, gpu: XmlGpu, tb: XmlThreadblock, tbs: dict[int, XmlThreadblock]) -> None:
        a = self.algo
        where = f"GPU {gpu.id} tb {tb.id}"
        for role, peer in (("send", tb.send), ("recv", tb.recv)):
            if peer == gpu.id:
                self.error(f"{where} has {role}=\"{peer}\", its own GPU; a peer must be another GPU", tb.line,
                           kind="peer", blocking=True)
            elif peer >= a.ngpus:
                self.error(f"{where} has {role}=\"{peer}\", but ngpus={a.ngpus}", tb.line, kind="peer",
                           blocking=True)
        if tb.chan >= MAX_CHANNELS:
            self.error(f"{where} uses channel {tb.chan}; the executor has channels 0..{MAX_CHANNELS - 1}",
                       tb.line, kind="channel")
        elif tb.chan >= a.nchannels:
            self.error(f"{where} uses channel {tb.chan}, but nchannels={a.nchannels}: the executor sets up "
                       f"connections on channels 0..{a.nchannels - 1} only", tb.line, kind="channel")
        if len(tb.steps) > self.max_steps:
            limit = (f"the current executor's limit is {MAX_STEPS_CURRENT} per threadblock (the older runtime "
                     f"allowed {MAX_STEPS_OLD_RUNTIME}: --runtime legacy)" if self.max_steps == MAX_STEPS_CURRENT
                     else f"the limit checked is {self.max_steps} per threadblock")
            self.error(f"{where} has {len(tb.steps)} steps; {limit}", tb.line, kind="limit")
        for position, step in enumerate(tb.steps):
            self.check_step(gpu, tb, position, step, tbs)

    def check_step(self, gpu: XmlGpu, tb: XmlThreadblock, position: int, step: XmlStep,
                   tbs: dict[int, XmlThreadblock]) -> None:
        ref = StepRef.of(gpu.id, tb, step)
        line = step.line
        if step.s != position:
            self.error(f"{ref} is the threadblock's step number {position} in document order; steps must be "
                       f"numbered s=0, 1, 2, ... as they appear (this one has s={step.s})", line, where=ref,
                       kind="step-number")
        t = step.type
        if t in SENDING and tb.send < 0:
            self.error(f"{ref} ({t.value}) sends, but its threadblock has send=\"-1\"", line, where=ref,
                       kind="peer", blocking=True)
        if t in RECEIVING and tb.recv < 0:
            self.error(f"{ref} ({t.value}) receives, but its threadblock has recv=\"-1\"", line, where=ref,
                       kind="peer", blocking=True)
        if t is not StepType.NOP:
            if step.cnt < 1:
                self.error(f"{ref} has cnt={step.cnt}; a {t.value} step moves at least one chunk", line,
                           where=ref, kind="count", blocking=step.cnt < 0)
            elif step.cnt >= MAX_COUNT:
                self.error(f"{ref} has cnt={step.cnt}; the executor needs cnt < {MAX_COUNT}", line, where=ref,
                           kind="limit")
        if self._sizes[0] is not gpu:  # once per GPU, not per step
            self._sizes = (gpu, {BufferName.INPUT: ("i_chunks", gpu.i_chunks),
                                 BufferName.OUTPUT: ("o_chunks", gpu.o_chunks),
                                 BufferName.SCRATCH: ("s_chunks", gpu.s_chunks)})
        sizes = self._sizes[1]
        for role, buffer, offset in _operands(step):
            assert buffer is not None  # the reader requires both buffers
            attr, size = sizes[buffer]
            end = offset + max(step.cnt, 0)
            if offset < 0 or end > size:
                span_text = f"[{offset}]" if step.cnt == 1 else f"[{offset}..{end - 1}]"
                self.error(f"{ref} ({t.value}) {'reads' if role == 'src' else 'writes'} "
                           f"{BUFFER_WORDS[buffer]}{span_text}, outside {attr}={size} of GPU {gpu.id}",
                           line, where=ref, kind="bounds", blocking=True)
        self.check_dependency(gpu, tb, step, ref, tbs)

    def check_dependency(self, gpu: XmlGpu, tb: XmlThreadblock, step: XmlStep, ref: StepRef,
                         tbs: dict[int, XmlThreadblock]) -> None:
        line = step.line
        if step.depid < -1:
            self.error(f"{ref} has depid={step.depid}; use -1 for no dependency", line, where=ref,
                       kind="dependency", blocking=True)
            return
        if step.depid == -1:
            if step.deps != -1:
                self.warning(f"{ref} has deps={step.deps} but depid=-1; the executor ignores deps", line,
                             where=ref, kind="dependency")
            return
        target = tbs.get(step.depid)
        if target is None:
            self.error(f"{ref} depends on tb {step.depid}, but GPU {gpu.id} has no such threadblock", line,
                       where=ref, kind="dependency", blocking=True)
            return
        if not 0 <= step.deps < len(target.steps):
            self.error(f"{ref} depends on tb {step.depid} step {step.deps}, but that threadblock has steps "
                       f"0..{len(target.steps) - 1}", line, where=ref, kind="dependency", blocking=True)
            return
        dep = target.steps[step.deps]
        if not dep.hasdep:
            self.error(f"{ref} depends on GPU {gpu.id} tb {step.depid} step {step.deps}, which has hasdep=\"0\": "
                       "the executor publishes progress only after steps with hasdep=\"1\"", line, where=ref,
                       kind="dependency", notes=(f"the depended-on step is at line {dep.line}",))

    def check_connections(self, gpus: list[XmlGpu]) -> None:
        """One sending and one receiving threadblock per (sender, receiver, channel), their
        send and receive steps pairing up in order with equal counts."""
        senders: dict[tuple[int, int, int], ThreadblockProgram] = {}
        receivers: dict[tuple[int, int, int], ThreadblockProgram] = {}
        for program in (p for per_gpu in self.programs for p in per_gpu):
            g, tb = program.gpu, program.tb
            for table, peer, active, verb in ((senders, tb.send, program.sends, "sends to"),
                                              (receivers, tb.recv, program.receives, "receives from")):
                if peer < 0 or not active or peer >= self.algo.ngpus or peer == g:
                    continue
                key = (g, peer, tb.chan) if table is senders else (peer, g, tb.chan)
                other = table.get(key)
                if other is not None:
                    first = self._transfer_steps(program, sending=table is senders)[0]
                    ref = StepRef.of(g, tb, first)
                    self.error(f"{ref} {verb} GPU {peer} on channel {tb.chan}, as tb {other.tb.id} of GPU {g} "
                               "does; one connection cannot carry two threadblocks' messages (use another "
                               "channel)", first.line, where=ref,
                               kind="connection", blocking=True,
                               notes=(f"tb {tb.id} is at line {tb.line}, tb {other.tb.id} at line {other.tb.line}",))
                else:
                    table[key] = program
        if self.blocking:
            return
        for key in sorted(set(senders) | set(receivers)):
            src, dst, chan = key
            sends = self._transfer_steps(senders.get(key), sending=True)
            recvs = self._transfer_steps(receivers.get(key), sending=False)
            for n, (a, b) in enumerate(zip(sends, recvs)):
                if a.cnt != b.cnt:
                    ra, rb = StepRef.of(src, senders[key].tb, a), StepRef.of(dst, receivers[key].tb, b)
                    self.error(f"{rb} receives {b.cnt} chunk(s) as message {n + 1} from GPU {src} on channel "
                               f"{chan}, but {ra} sends {a.cnt}", b.line, where=rb, kind="count-mismatch",
                               blocking=True, notes=(f"{ra} is at line {a.line}",))
            if len(sends) > len(recvs):
                extra = sends[len(recvs)]
                ref = StepRef.of(src, senders[key].tb, extra)
                who = (f"GPU {dst} tb {receivers[key].tb.id} receives only {len(recvs)}" if key in receivers
                       else f"no threadblock of GPU {dst} receives from GPU {src} on channel {chan}")
                self.error(f"{ref} sends message {len(recvs) + 1} to GPU {dst} on channel {chan}, but {who}",
                           extra.line, where=ref, kind="unmatched-send", blocking=True)
            elif len(recvs) > len(sends):
                extra = recvs[len(sends)]
                ref = StepRef.of(dst, receivers[key].tb, extra)
                who = (f"GPU {src} tb {senders[key].tb.id} sends only {len(sends)}" if key in senders
                       else f"no threadblock of GPU {src} sends to GPU {dst} on channel {chan}")
                self.error(f"{ref} receives message {len(sends) + 1} from GPU {src} on channel {chan}, but {who}",
                           extra.line, where=ref, kind="unmatched-receive", blocking=True)

    @staticmethod
    def _transfer_steps(program: ThreadblockProgram | None, *, sending: bool) -> list[XmlStep]:
        if program is None:
            return []
        return [s for s in program.tb.steps if (s.type.sends if sending else s.type.receives)]

    # -- 2 and 3. execution and postcondition ------------------------------------------------------
    def execute(self, gpus: list[XmlGpu]) -> None:
        a = self.algo
        coll = self.collective()
        found: dict[tuple[str, int | None], list[tuple[str, XmlVerifyError]]] = {}
        for mode in self.modes:
            in_place = mode == IN_PLACE
            if coll is not None:
                layouts = [rank_layout(self.kind, in_place, g.id, coll.in_chunks[g.id], coll.out_chunks(g.id),
                                       g.s_chunks) for g in gpus]
                inputs: Sequence[int] = coll.in_chunks
            else:
                layouts = [rank_layout(None, in_place, g.id, g.i_chunks, g.o_chunks, g.s_chunks) for g in gpus]
                inputs = [g.i_chunks for g in gpus]
            result = simulate(a, layouts, input_chunks=inputs, programs=self.programs, max_issues=self.max_errors,
                              check_races=self.check_races, fifo_capacity=self.fifo_capacity)
            problems = [self.issue_error(i) for i in result.errors]
            if result.suppressed:
                problems.append(XmlVerifyError(f"{result.suppressed} more execution errors are not shown",
                                               self.span(None), kind="truncated"))
            if coll is not None and result.finished:
                problems.extend(self.postcondition(coll, result, gpus))
            for p in problems:
                found.setdefault((p.message, p.span.line if p.span else None), []).append((mode, p))
        for hits in found.values():
            mode, err = hits[0]
            if len(self.modes) > 1 and len(hits) < len(self.modes):
                err = XmlVerifyError(f"{mode}: {err.message}", err.span, err.notes, where=err.where, kind=err.kind)
            if len(self.errors) < self.max_errors:
                self.errors.append(err)

    def issue_error(self, issue: Issue) -> XmlVerifyError:
        line = issue.where.line if issue.where else None
        return XmlVerifyError(issue.message, self.span(line), issue.notes, where=issue.where, kind=issue.kind.value)

    def postcondition(self, coll: ExpectedCollective, result: SimulationResult,
                      gpus: list[XmlGpu]) -> list[XmlVerifyError]:
        if self.kind in ROOTED:
            if self.root is None:
                self.infer_root(result)
            coll = self.collective()  # type: ignore[assignment]
            assert coll is not None
        # Encoded values compare by value, and a copy shares its object: an identity test
        # settles most slots before `==` (an AllReduce's full masks are n bits each).
        wrong = []
        for r in range(coll.ranks):
            for j, expected in enumerate(coll.outputs[r]):
                if expected is None:
                    continue
                got = result.code(r, BufferName.OUTPUT, j)
                if got is not expected and got != expected:
                    wrong.append((r, j, expected, got))
        wrong = [w for w in wrong if w[3] is not POISON]  # already reported where it went wrong
        shown = 10
        errors = [self.slot_error(coll, result, gpus, *w) for w in wrong[:shown]]
        if len(wrong) > shown:
            errors.append(XmlVerifyError(f"{len(wrong) - shown} more output slots do not hold what "
                                         f"{coll.kind.value} needs", self.span(None), kind="postcondition"))
        return errors

    def slot_error(self, coll: ExpectedCollective, result: SimulationResult, gpus: list[XmlGpu], rank: int,
                   j: int, expected_code: Code, actual_code: Code | None) -> XmlVerifyError:
        writer = result.last_writer(rank, BufferName.OUTPUT, j)
        expected = result.codec.decode(expected_code)
        need = f"{coll.kind.value} needs {value_str(expected)} there"
        if actual_code is None:
            return XmlVerifyError(f"GPU {rank} output[{j}] is never written; {need}", self.span(gpus[rank].line),
                                  kind="postcondition")
        actual = result.codec.decode(actual_code)
        details = []
        if missing := expected - actual:
            details.append(f"missing {value_str(missing)}")
        if extra := actual - expected:
            details.append(f"with {value_str(extra)} that does not belong")
        return XmlVerifyError(
            f"GPU {rank} output[{j}] holds {value_str(actual)} after {writer} wrote it, but {need} "
            f"({'; '.join(details)})", self.span(writer.line if writer else gpus[rank].line),
            where=writer, kind="postcondition")

    def infer_root(self, result: SimulationResult) -> None:
        """The file names no root: take the rank for which the postcondition holds (or
        fails least), and say so."""
        a = self.algo
        kind = self.kind
        assert kind is not None

        def misses(root: int) -> int:
            c = expected_codes(kind, a.ngpus, a.nchunksperloop, root)
            return sum(1 for r in range(c.ranks) for j, e in enumerate(c.outputs[r])
                       if e is not None and result.code(r, BufferName.OUTPUT, j) != e)

        scores = [misses(r) for r in range(a.ngpus)]
        best = min(range(a.ngpus), key=lambda r: scores[r])
        self.root = best
        holds = [r for r in range(a.ngpus) if scores[r] == 0]
        if len(holds) == 1:
            why = "the rank for which the postcondition holds"
        elif holds:
            why = f"the lowest of ranks {', '.join(map(str, holds))}, for which the postcondition holds"
        else:
            why = "the rank for which the fewest output slots are wrong"
        self.warning(f"<algo> names no root; {kind.value} is checked with root {best}, {why}", kind="inferred-root")
