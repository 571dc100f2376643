"""NCCL calls in PyTorch profiler (Kineto) Chrome traces.

One record per NCCL kernel (`ncclKernel_*`, `ncclDevKernel_*`), with its GPU duration.
The collective, sizes and process group come from, in order of preference:
1. the kernel's own `args` (`Collective name`, `In/Out msg nelems`, `Group size`, ...);
2. a `record_param_comms` CPU op carrying those args that encloses the kernel's launch;
3. the `nccl:*` operator that launched the kernel (`named_by="launch-op"`): the CUDA
   runtime launch event and the kernel share `args.correlation`, and the op encloses the
   launch on the same CPU thread; its `Input Dims`/`Input type` give the size.
A trace without NCCL kernels (CPU-only profiling) gives one record per
`record_param_comms` op that names a collective, without a duration.

Only events whose text mentions NCCL, `record_param_comms` or a kernel launch are parsed.
"""

from __future__ import annotations

import bisect
import math
from array import array
from collections import Counter
from dataclasses import dataclass
from typing import Any, Iterator

from ..diagnostics import CollcError, Span
from ..limits import int_limit
from .chrome import ChromeTrace, event_interval
from .collectives import collective_from_c10d, kernel_name_collective, nccl_tests_bytes
from .detect import TraceSource
from .records import CollectiveCall, SourceSummary, TraceContext

PREFILTER = (b"ncclKernel", b"ncclDevKernel", b"nccl:", b"record_param_comms", b"LaunchKernel")

# c10 ScalarType names (kernel/record_param_comms `dtype`) and profiler `Input type` strings.
DTYPES: dict[str, tuple[str, int]] = {}
for _names, _dtype, _size in (
        (("Float", "float", "float32"), "float32", 4),
        (("Double", "double", "float64"), "float64", 8),
        (("Half", "c10::Half", "half", "float16"), "float16", 2),
        (("BFloat16", "c10::BFloat16", "bfloat16"), "bfloat16", 2),
        (("Int", "int", "int32"), "int32", 4),
        (("Long", "long", "long int", "int64", "long long"), "int64", 8),
        (("Short", "short", "short int", "int16"), "int16", 2),
        (("Char", "signed char", "int8"), "int8", 1),
        (("Byte", "unsigned char", "uint8"), "uint8", 1),
        (("Bool", "bool"), "bool", 1),
        (("Float8_e4m3fn", "c10::Float8_e4m3fn"), "fp8_e4m3", 1),
        (("Float8_e5m2", "c10::Float8_e5m2"), "fp8_e5m2", 1),
        (("ComplexFloat", "c10::complex<float>"), "complex64", 8)):
    for _name in _names:
        DTYPES[_name] = (_dtype, _size)

def _parse_ranks(value: Any) -> tuple[int, ...] | None:
    if isinstance(value, list):
        return tuple(int(v) for v in value)
    if isinstance(value, str) and value.startswith("["):
        inner = value.strip("[] ")
        try:
            return tuple(int(v) for v in inner.split(",")) if inner else None
        except ValueError:
            return None
    return None


@dataclass
class _Metadata:
    """What `args` (of a kernel or record_param_comms) say about a collective."""

    collective: str
    dtype: str | None
    count: int | None
    bytes: int | None
    nranks: int | None
    communicator: str | None
    ranks: tuple[int, ...] | None
    pg_desc: str | None
    seq: int | None
    in_bytes: int | None = None
    out_bytes: int | None = None


def _int(v: Any) -> int | None:
    """An integer field (a number or a string of one) that fits 64 bits, else None."""
    if isinstance(v, str) and len(v) > 20:
        return None
    try:
        value = int(v) if v is not None and v != "" else None
    except (TypeError, ValueError, OverflowError):
        return None
    return value if value is None or abs(value) < 1 << 63 else None


def _args(event: dict[str, Any]) -> dict[str, Any]:
    args = event.get("args")
    return args if isinstance(args, dict) else {}


def _thread_key(event: dict[str, Any]) -> tuple[Any, Any]:
    """(pid, tid) as dictionary keys: a list or an object there is shown, not hashed."""
    return tuple(v if isinstance(v, (int, float, str, type(None))) else repr(v)[:64]  # type: ignore[return-value]
                 for v in (event.get("pid"), event.get("tid")))


def metadata_from_args(args: dict[str, Any]) -> _Metadata | None:
    name = args.get("Collective name")
    if not isinstance(name, str):
        return None
    coll = collective_from_c10d(name)
    if coll is None:
        return None
    dtype_name = args.get("dtype")
    dtype, size = DTYPES.get(dtype_name, (dtype_name, None)) if isinstance(dtype_name, str) else (None, None)
    n_in, n_out = _int(args.get("In msg nelems")), _int(args.get("Out msg nelems"))
    if n_in is None and n_out is None:      # 2023 traces: sizes in elements under another name
        n_in, n_out = _int(args.get("In msg size")), _int(args.get("Out msg size"))
    in_b = n_in * size if n_in is not None and size else None
    out_b = n_out * size if n_out is not None and size else None
    count = n_in if coll not in ("allgather", "gather", "recv") else (n_out or n_in)
    pg = args.get("Process Group Name")
    return _Metadata(collective=coll, dtype=dtype, count=count,
                     bytes=nccl_tests_bytes(coll, in_b, out_b),
                     nranks=_int(args.get("Group size")),
                     communicator=str(pg) if pg is not None else None,
                     ranks=_parse_ranks(args.get("Process Group Ranks")),
                     pg_desc=args.get("Process Group Description"),
                     seq=_int(args.get("Seq", args.get("seq"))), in_bytes=in_b, out_bytes=out_b)


def metadata_from_launch_op(op: dict[str, Any]) -> _Metadata | None:
    """An `nccl:*` op's collective, and its size from the tensors it was given."""
    coll = collective_from_c10d(op.get("name", ""))
    if coll is None:
        return None
    args = op.get("args") or {}
    dims, types = args.get("Input Dims") or [], args.get("Input type") or []
    elements, dtype, size = 0, None, None
    for shape, type_name in zip(dims, types):
        known = DTYPES.get(type_name) if isinstance(type_name, str) else None
        if known is None or not isinstance(shape, list) or not shape:
            continue
        if dtype is None:
            dtype, size = known
        if known[0] == dtype:
            elements += math.prod(int(d) for d in shape)
    in_bytes = elements * size if size else None
    # The op records its input tensors: the whole buffer for every collective but
    # AllGather/Gather, whose input is one rank's part (nccl-tests' size needs nranks).
    nbytes = None if coll in ("allgather", "gather") else in_bytes
    return _Metadata(collective=coll, dtype=dtype, count=elements if dtype else None,
                     bytes=nbytes, nranks=None, communicator=None, ranks=None, pg_desc=None,
                     seq=None, in_bytes=in_bytes)


@dataclass
class _Kernel:
    name: str
    ts: float
    dur: float
    correlation: int | None
    location: str
    meta: _Metadata | None


class _CpuOps:
    """CPU ops of one kind (nccl:* or record_param_comms) per thread, found by time."""

    def __init__(self) -> None:
        self._by_thread: dict[tuple[Any, Any], list[tuple[float, float, dict[str, Any]]]] = {}

    def add(self, event: dict[str, Any]) -> None:
        interval = event_interval(event.get("ts"), event.get("dur"))
        if isinstance(interval, str):
            return
        self._by_thread.setdefault(_thread_key(event), []).append((*interval, event))

    def seal(self) -> None:
        for ops in self._by_thread.values():
            ops.sort(key=lambda o: o[0])

    def enclosing(self, pid: Any, tid: Any, ts: float) -> dict[str, Any] | None:
        ops = self._by_thread.get((pid, tid))
        if not ops:
            return None
        i = bisect.bisect_right(ops, ts, key=lambda o: o[0]) - 1
        # The latest op starting before ts that is still running at ts. Ops of one kind
        # rarely nest, so a few steps back suffice.
        for _ in range(64):
            if i < 0:
                break
            start, end, event = ops[i]
            if end >= ts:
                return event
            i -= 1
        return None

    def __len__(self) -> int:
        return sum(len(v) for v in self._by_thread.values())


class _Launches:
    """CUDA runtime launch events, kept compactly: correlation -> (thread, ts)."""

    def __init__(self) -> None:
        self.correlation = array("q")
        self.ts = array("d")
        self.thread = array("i")
        self._threads: dict[tuple[Any, Any], int] = {}
        self._thread_keys: list[tuple[Any, Any]] = []

    def add(self, event: dict[str, Any]) -> None:
        corr = _int(_args(event).get("correlation"))
        interval = event_interval(event.get("ts"), 0)
        if corr is None or isinstance(interval, str):
            return
        ts = interval[0]
        key = _thread_key(event)
        idx = self._threads.get(key)
        if idx is None:
            idx = self._threads[key] = len(self._thread_keys)
            self._thread_keys.append(key)
        self.correlation.append(corr)
        self.ts.append(float(ts))
        self.thread.append(idx)

    def index(self, wanted: set[int]) -> dict[int, tuple[tuple[Any, Any], float]]:
        return {c: (self._thread_keys[t], ts)
                for c, t, ts in zip(self.correlation, self.thread, self.ts) if c in wanted}


def _is_nccl_kernel(event: dict[str, Any]) -> bool:
    name = event.get("name")
    return (isinstance(name, str) and (name.startswith("ncclKernel") or name.startswith("ncclDevKernel"))
            and event.get("ph") == "X")


def read_kineto(source: TraceSource, summary: SourceSummary, context: TraceContext
                ) -> Iterator[CollectiveCall]:
    trace = ChromeTrace(source)
    kernels: list[_Kernel] = []
    nccl_ops, param_ops = _CpuOps(), _CpuOps()
    cpu_records: list[tuple[dict[str, Any], str]] = []
    launches = _Launches()
    for event in trace.events(PREFILTER):
        name = event.get("name")
        if not isinstance(name, str):
            continue
        cat = event.get("cat")
        if _is_nccl_kernel(event):
            if "ts" not in event or "dur" not in event:
                raise CollcError(f"NCCL kernel event without ts/dur: {name[:60]}",
                                 _span(source, trace))
            interval = event_interval(event["ts"], event["dur"])
            if isinstance(interval, str):
                summary.skip(f"NCCL kernel with a {interval}")
                continue
            args = _args(event)
            # The duration as written: end - start would lose digits at large timestamps.
            kernels.append(_Kernel(name, interval[0], float(event["dur"]),
                                   _int(args.get("correlation")), trace.location(),
                                   metadata_from_args(args)))
        elif name.startswith("nccl:") and cat in ("user_annotation", "cpu_op"):
            nccl_ops.add(event)
        elif name == "record_param_comms" and cat == "cpu_op":
            param_ops.add(event)
            if isinstance(_args(event).get("Collective name"), str):
                cpu_records.append((event, trace.location()))
        elif cat in ("cuda_runtime", "cuda_driver", "hip_runtime", "runtime") and "LaunchKernel" in name:
            launches.add(event)
    rank, world = _distributed_info(trace.metadata, context)
    if kernels:
        yield from _kernel_records(source, summary, context, kernels, nccl_ops, param_ops,
                                   launches, rank)
    else:
        yield from _cpu_records(source, summary, context, cpu_records, rank)


def _span(source: TraceSource, trace: ChromeTrace) -> Span:
    loc = trace.location()
    line = int(loc.split()[-1]) if loc.startswith("line") else 1
    return Span(source.name, line, 1)


def _distributed_info(meta: dict[str, Any], context: TraceContext) -> tuple[int | None, int | None]:
    info = meta.get("distributedInfo") or {}
    if not isinstance(info, dict):
        return None, None
    rank, world = _int(info.get("rank")), _int(info.get("world_size"))
    ranks_limit = int_limit("ranks")
    rank = rank if rank is not None and 0 <= rank < ranks_limit else None
    world = world if world is not None and 0 < world <= ranks_limit else None
    context.saw_world_size(world)
    for pg in info.get("pg_config") or []:
        if isinstance(pg, dict) and pg.get("pg_name") is not None:
            ranks = _parse_ranks(pg.get("ranks"))
            context.communicator(str(pg["pg_name"]), _int(pg.get("pg_size")), ranks or None,
                                 pg.get("pg_desc"))
    return rank, world


def _kernel_records(source, summary, context, kernels, nccl_ops, param_ops, launches, rank):
    nccl_ops.seal()
    param_ops.seal()
    unnamed = {k.correlation for k in kernels if k.meta is None and k.correlation is not None}
    launch_of = launches.index(unnamed) if unnamed else {}
    kinds: Counter = Counter()
    for k in kernels:
        meta, named_by = k.meta, "metadata"
        if meta is None:
            meta, named_by = _meta_from_launch(k, launch_of, nccl_ops, param_ops)
        if meta is None:
            # Every NCCL kernel is a row of the table, or its calls and time would not add
            # up to the trace's: the kernel's own name says what it ran, if not its size.
            meta = _Metadata(kernel_name_collective(k.name), None, None, None, None, None, None, None, None)
            named_by = "kernel-name"
        kinds[named_by] += 1
        if meta.communicator is not None:
            context.communicator(meta.communicator, meta.nranks, meta.ranks, meta.pg_desc)
        summary.records += 1
        algorithm, protocol = _kernel_algorithm(k.name)
        yield CollectiveCall(source=source.name, location=k.location, collective=meta.collective,
                             rank=rank, communicator=meta.communicator, nranks=meta.nranks,
                             dtype=meta.dtype, count=meta.count, bytes=meta.bytes, seq=meta.seq,
                             start_us=k.ts, duration_us=k.dur, group_ranks=meta.ranks,
                             algorithm=algorithm, protocol=protocol, named_by=named_by,
                             in_bytes=meta.in_bytes, out_bytes=meta.out_bytes)
    if kinds["launch-op"] or kinds["kernel-name"]:
        context.notes.append(kernel_naming_note(source.name, len(kernels), kinds))


def kernel_naming_note(name: str, kernels: int, kinds: Counter) -> str:
    """How a trace's NCCL kernels were named: every one is in the table, by one of three."""
    parts = [f"{kinds['metadata']} by their collective metadata"]
    if kinds["launch-op"]:
        parts.append(f"{kinds['launch-op']} by the nccl:* op that launched them (no metadata; marked *)")
    if kinds["kernel-name"]:
        parts.append(f"{kinds['kernel-name']} by their kernel name alone (no metadata, no launching op in "
                     "the trace: size unknown; marked +)")
    return f"{name}: {kernels} NCCL kernels, named " + ", ".join(parts)


def _meta_from_launch(k: _Kernel, launch_of, nccl_ops: _CpuOps, param_ops: _CpuOps):
    launch = launch_of.get(k.correlation) if k.correlation is not None else None
    if launch is None:
        return None, "metadata"
    (pid, tid), ts = launch
    param = param_ops.enclosing(pid, tid, ts)
    if param is not None:
        meta = metadata_from_args(param.get("args") or {})
        if meta is not None:
            return meta, "metadata"
    op = nccl_ops.enclosing(pid, tid, ts)
    if op is not None:
        meta = metadata_from_launch_op(op)
        if meta is not None:
            return meta, "launch-op"
    return None, "metadata"


_ALGOS = ("RING", "TREE", "COLLNET_DIRECT", "COLLNET_CHAIN", "NVLS_TREE", "NVLS", "PAT")
_PROTOS = ("LL128", "LL", "SIMPLE")


def _kernel_algorithm(name: str) -> tuple[str | None, str | None]:
    """`ncclKernel_AllReduce_RING_LL_Sum_float` -> ("RING", "LL")."""
    base = name.split("(", 1)[0]
    parts = base.split("_")
    algo = next((a for a in _ALGOS if f"_{a}_" in base + "_"), None)
    proto = next((p for p in _PROTOS if p in parts), None)
    return algo, proto


def _cpu_records(source, summary, context, cpu_records, rank):
    for event, location in cpu_records:
        meta = metadata_from_args(event.get("args") or {})
        if meta is None:
            summary.skip("record_param_comms of no collective (barrier, init, ...)")
            continue
        if meta.communicator is not None:
            context.communicator(meta.communicator, meta.nranks, meta.ranks, meta.pg_desc)
        summary.records += 1
        yield CollectiveCall(source=source.name, location=location, collective=meta.collective,
                             rank=rank, communicator=meta.communicator, nranks=meta.nranks,
                             dtype=meta.dtype, count=meta.count, bytes=meta.bytes, seq=meta.seq,
                             start_us=float(event["ts"]) if "ts" in event else None,
                             duration_us=None, group_ranks=meta.ranks, named_by="metadata",
                             in_bytes=meta.in_bytes, out_bytes=meta.out_bytes)
