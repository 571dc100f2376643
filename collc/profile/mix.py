"""The mix: every rank's call records combined into one table of the job's collective traffic.

Rows are (communicator, collective, data type, size in bytes). A call the job made is
recorded once by every rank of its communicator that was traced; those records are
matched into one *job call*:

- collectives: per communicator, by `seq` where every traced rank's records on that
  communicator carry distinct sequence numbers (NCCL's opCount repeats within a group
  launch, so it is used only when it is unique), otherwise by order (the n-th call a
  rank makes on a communicator is the n-th call of every other rank: NCCL requires all
  ranks of a communicator to issue its collectives in the same order);
- Send/Recv: the n-th send from rank a to rank b is the n-th receive on b from a. A
  matched pair is one transfer, reported on the `send` row (its `calls` counts both
  ends); receives whose send was not traced stay on a `recv` row.

A job call's latency is the shortest duration among its records (the other ranks'
durations include waiting for the last rank to arrive); the difference between the
longest and the shortest is its straggler time. Rows sum both over their job calls.
"""

from __future__ import annotations

import gc
import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from collc.profile.iterations import MAX_WARMUP, MIN_ITERATION_CALLS, find_iterations  # noqa: F401 (re-exported: they were defined here)
from collc.traces.records import CollectiveCall
from collc.units import format_bytes

P2P = ("send", "recv")

# nccl-tests' busbw factors (reference section 4; its src/<coll>.cu GetBw functions).
_BUS_FACTOR = {
    "allreduce": lambda n: 2 * (n - 1) / n,
    "allgather": lambda n: (n - 1) / n,
    "reducescatter": lambda n: (n - 1) / n,
    "alltoall": lambda n: (n - 1) / n,
    "gather": lambda n: (n - 1) / n,
    "scatter": lambda n: (n - 1) / n,
}

COMBINE_NOTE = (
    "one row per (communicator, collective, dtype, bytes); a call recorded by several ranks "
    "is one job call, matched per communicator by Seq where unique, else by call order "
    "(Send/Recv: n-th send a->b with n-th recv on b from a, reported on the send row); "
    "latency = shortest duration across ranks, straggler = longest - shortest")


def bus_factor(collective: str, nranks: int | None) -> float:
    """busbw / algbw for `collective` on `nranks` ranks (1.0 where nccl-tests uses 1)."""
    if not nranks or nranks < 1:
        return 1.0
    return _BUS_FACTOR.get(collective, lambda n: 1.0)(nranks)


@dataclass(slots=True)
class JobCall:
    """One call of the job: the records of it that the traced ranks made."""

    collective: str
    communicator: str
    records: list[CollectiveCall]
    order: tuple  # where it falls in its first rank's stream (for iteration detection)

    @property
    def first(self) -> CollectiveCall:
        return self.records[0]

    @property
    def ranks(self) -> set:
        return {rank_key(c) for c in self.records}

    @property
    def durations(self) -> list[float]:
        return [c.duration_us for c in self.records if c.duration_us is not None]

    @property
    def latency_us(self) -> float | None:
        d = self.durations
        return min(d) if d else None

    @property
    def straggler_us(self) -> float | None:
        d = self.durations
        return (max(d) - min(d)) if d else None


@dataclass
class MixRow:
    communicator: str
    collective: str
    dtype: str | None
    bytes: int | None
    nranks: int | None
    calls: int = 0            # records in the input (one per rank per call)
    job_calls: int = 0        # calls of the job (records matched across ranks)
    timed_calls: int = 0      # job calls with a measured duration
    ranks: set = field(default_factory=set)
    peers: set = field(default_factory=set)   # Send/Recv: the other ends the records name
    time_us: float | None = None
    straggler_us: float | None = None
    named_by: Counter = field(default_factory=Counter)

    @property
    def bytes_total(self) -> int | None:
        """nccl-tests' size times job calls: what the job moved through this row."""
        return None if self.bytes is None else self.bytes * self.job_calls

    @property
    def algbw_GBps(self) -> float | None:
        """Mean achieved algbw over the timed job calls (nccl-tests: size / latency)."""
        if self.bytes is None or not self.time_us or not self.timed_calls:
            return None
        return self.bytes * self.timed_calls / (self.time_us * 1e-6) / 1e9

    @property
    def busbw_GBps(self) -> float | None:
        alg = self.algbw_GBps
        return None if alg is None else alg * bus_factor(self.collective, self.nranks)

    def to_json(self) -> dict[str, Any]:
        return {
            "collective": self.collective, "communicator": self.communicator, "nranks": self.nranks,
            "dtype": self.dtype, "bytes": self.bytes, "calls": self.calls, "job_calls": self.job_calls,
            "ranks_seen": len(self.ranks), "time_us": self.time_us,
            "latency_us": (self.time_us / self.timed_calls) if self.time_us is not None and self.timed_calls
            else None,
            "straggler_us": self.straggler_us, "bytes_total": self.bytes_total,
            "algbw_GBps": self.algbw_GBps, "busbw_GBps": self.busbw_GBps,
            "named_by": dict(sorted(self.named_by.items())),
            "peers": sorted(self.peers, key=str) if self.collective in P2P else None,
        }


@dataclass
class Communicator:
    id: str
    nranks: int | None
    ranks: tuple[int, ...] | None
    name: str | None = None
    role: str = "unknown"
    role_reason: str = ""
    time_us: float | None = None
    bytes_total: int = 0
    job_calls: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "nranks": self.nranks,
                "ranks": list(self.ranks) if self.ranks is not None else None, "role": self.role,
                "role_reason": self.role_reason, "job_calls": self.job_calls, "time_us": self.time_us,
                "bytes_total": self.bytes_total}


@dataclass
class Iterations:
    count: int
    calls_per_iteration: int
    warmup_calls: int
    method: str

    def to_json(self) -> dict[str, Any]:
        return {"count": self.count, "calls_per_iteration": self.calls_per_iteration,
                "warmup_calls": self.warmup_calls, "method": self.method}


@dataclass
class Mix:
    rows: list[MixRow]
    communicators: dict[str, Communicator]
    world_size: int | None
    iterations: Iterations | None
    job_calls: list[JobCall]
    notes: list[str] = field(default_factory=list)
    combined: str = COMBINE_NOTE

    @property
    def timed(self) -> bool:
        """Whether the shares are of measured time (else of bytes)."""
        return any(r.time_us for r in self.rows)

    def weight(self, row: MixRow) -> float:
        """What "biggest" means: measured time where the trace has it, else bytes moved."""
        if self.timed:
            return row.time_us or 0.0
        return float(row.bytes_total or 0)

    def sorted_rows(self) -> list[MixRow]:
        return sorted(self.rows, key=lambda r: (-self.weight(r), r.communicator, r.collective, r.bytes or 0))

    def shares(self, key) -> dict[str, float]:
        """Share of the total weight per `key(row)`, biggest first."""
        total = sum(self.weight(r) for r in self.rows)
        acc: dict[str, float] = defaultdict(float)
        for r in self.rows:
            acc[key(r)] += self.weight(r)
        return dict(sorted(((k, v / total if total else 0.0) for k, v in acc.items()), key=lambda kv: -kv[1]))

    def to_json(self) -> dict[str, Any]:
        return {
            "world_size": self.world_size,
            "ranks_combined": self.combined,
            "weighted_by": "time" if self.timed else "bytes",
            "iterations": self.iterations.to_json() if self.iterations else None,
            "communicators": [c.to_json() for c in self.communicators.values()],
            "collectives": [r.to_json() for r in self.sorted_rows()],
            "share_by_collective": self.shares(lambda r: r.collective),
            "share_by_communicator": self.shares(lambda r: r.communicator),
            "notes": list(self.notes),
        }


# --- matching ---------------------------------------------------------------------------

def rank_key(call: CollectiveCall) -> int | str:
    """The recording rank, or its file where the trace does not say."""
    return call.rank if call.rank is not None else f"file {call.source}"


def communicator_key(call: CollectiveCall) -> str:
    return call.communicator if call.communicator is not None else "?"


def _stream_order(calls: list[tuple[int, CollectiveCall]]) -> list[tuple[int, CollectiveCall]]:
    """A rank's calls (with their read positions) on one communicator in issue order: by
    start time where all have one (files may list kernels by stream), else as read."""
    if all(c.start_us is not None for _, c in calls):
        return sorted(calls, key=lambda ic: ic[1].start_us)  # stable: ties keep read order
    return calls


def _uses_seq(streams: Iterable[list[tuple[int, CollectiveCall]]]) -> bool:
    for calls in streams:
        seqs = [c.seq for _, c in calls]
        if any(s is None for s in seqs) or len(set(seqs)) != len(seqs):
            return False
    return True


def match_calls(calls: Sequence[CollectiveCall]) -> list[JobCall]:
    """Group the records of one call made by several ranks into one `JobCall`.

    Written for logs of millions of records: a record is carried with its position in
    `calls` (no lookup table by identity), and on a communicator only one rank recorded
    (one rank's log, or a trace per file with no process group) every record is its own
    job call, made without the grouping dictionary."""
    collective_streams: dict[str, dict[Any, list[tuple[int, CollectiveCall]]]] = {}
    p2p_streams: dict[tuple, list[tuple[int, CollectiveCall]]] = defaultdict(list)
    for i, c in enumerate(calls):
        comm = c.communicator if c.communicator is not None else "?"
        me = c.rank if c.rank is not None else f"file {c.source}"
        if c.collective in P2P:
            peer = c.peer
            src, dst = (me, peer) if c.collective == "send" else (peer, me)
            p2p_streams[(comm, c.collective, src, dst, me if peer is None else None)].append((i, c))
        else:
            by_rank = collective_streams.get(comm)
            if by_rank is None:
                by_rank = collective_streams[comm] = {}
            stream = by_rank.get(me)
            if stream is None:
                stream = by_rank[me] = []
            stream.append((i, c))

    alone: list[JobCall] = []
    groups: dict[tuple, list[tuple[int, CollectiveCall]]] = {}
    for comm, by_rank in collective_streams.items():
        if len(by_rank) == 1:       # one rank: nothing to match with
            for cs in by_rank.values():
                alone.extend(JobCall(c.collective, comm, [c], (i,)) for i, c in cs)
            continue
        ordered = {r: _stream_order(cs) for r, cs in by_rank.items()}
        by_seq = _uses_seq(ordered.values())
        for cs in ordered.values():
            for n, (i, c) in enumerate(cs):
                # A record only joins records that agree on what was called.
                key = (comm, "seq" if by_seq else "order", c.seq if by_seq else n, c.collective, c.bytes)
                groups.setdefault(key, []).append((i, c))
    for (comm, kind, src, dst, _), cs in p2p_streams.items():
        for n, (i, c) in enumerate(_stream_order(cs)):
            if src is None or dst is None:  # peer unknown: the record stands alone
                alone.append(JobCall(c.collective, comm, [c], (i,)))
                continue
            groups.setdefault((comm, "p2p", src, dst, n, c.bytes), []).append((i, c))

    job_calls = alone
    for key, recs in groups.items():
        recs.sort(key=_position)
        kinds = {c.collective for _, c in recs}
        collective = "send" if "send" in kinds else recs[0][1].collective
        job_calls.append(JobCall(collective, key[0], [c for _, c in recs], (recs[0][0],)))
    job_calls.sort(key=_order)
    return job_calls


def _position(entry: tuple[int, CollectiveCall]) -> int:
    return entry[0]


def _order(j: JobCall) -> tuple:
    return j.order


# --- the table ----------------------------------------------------------------------------

def build_rows(job_calls: Iterable[JobCall]) -> list[MixRow]:
    rows: dict[tuple, MixRow] = {}
    for j in job_calls:
        records = j.records
        f = records[0]
        key = (j.communicator, j.collective, f.dtype, f.bytes)
        row = rows.get(key)
        if len(records) == 1:       # most job calls of a one-rank log: no lists made
            nranks = f.nranks or None
            if row is None:
                row = rows[key] = MixRow(j.communicator, j.collective, f.dtype, f.bytes, nranks)
            elif not row.nranks:
                row.nranks = nranks
            row.calls += 1
            row.job_calls += 1
            row.ranks.add(f.rank if f.rank is not None else f"file {f.source}")
            row.named_by[f.named_by] += 1
            if f.peer is not None:
                row.peers.add(f.peer)
            if f.duration_us is not None:
                row.timed_calls += 1
                row.time_us = (row.time_us or 0.0) + f.duration_us
                row.straggler_us = (row.straggler_us or 0.0)
            continue
        # The size of the communicator the call ran on, Send/Recv included (their other
        # end is the row's `peers`, not a communicator of two).
        nranks = next((c.nranks for c in records if c.nranks), None)
        if row is None:
            row = rows[key] = MixRow(j.communicator, j.collective, f.dtype, f.bytes, nranks)
        row.nranks = row.nranks or nranks
        row.calls += len(records)
        row.job_calls += 1
        row.ranks |= j.ranks
        for c in records:
            row.named_by[c.named_by] += 1
            if c.peer is not None:
                row.peers.add(c.peer)
        lat = j.latency_us
        if lat is not None:
            row.timed_calls += 1
            row.time_us = (row.time_us or 0.0) + lat
            row.straggler_us = (row.straggler_us or 0.0) + (j.straggler_us or 0.0)
    return list(rows.values())


# --- communicators and their roles ----------------------------------------------------------

def _members(comm: str, info: Any, calls: list[CollectiveCall]) -> tuple[int, ...] | None:
    if info is not None and getattr(info, "ranks", None):
        return tuple(info.ranks)
    for c in calls:
        if c.group_ranks:
            return tuple(c.group_ranks)
    return None


def guess_role(nranks: int | None, members: tuple[int, ...] | None, kinds: Counter,
               world_size: int | None) -> tuple[str, str]:
    """A guess at a communicator's parallelism role, and why.

    The heuristic follows how Megatron-style jobs lay out their process groups (tensor
    parallel innermost, on consecutive ranks; data parallel outermost):
    - mostly Send/Recv: pipeline-parallel (stages pass activations point to point);
    - mostly AlltoAll: expert-parallel (MoE token dispatch);
    - AllReduce/AllGather/ReduceScatter on every rank of the job: data-parallel
      (gradient reduction, or sharded-optimizer gathers);
    - the same on a proper subset of consecutive ranks (stride 1): tensor-parallel;
      on a strided subset: data-parallel (DP groups stride over the TP x PP block).
    Weights are the communicator's job calls per kind. Without members or sizes the
    guess says unknown.
    """
    total = sum(kinds.values())
    if not total:
        return "unknown", "no calls"
    p2p = kinds["send"] + kinds["recv"]
    if p2p / total > 0.5:
        return "pipeline-parallel", f"{p2p} of {total} calls are Send/Recv"
    if kinds["alltoall"] / total > 0.5:
        return "expert-parallel", f"{kinds['alltoall']} of {total} calls are AlltoAll"
    dense = kinds["allreduce"] + kinds["allgather"] + kinds["reducescatter"]
    if dense / total <= 0.5:
        top = kinds.most_common(1)[0][0]
        return "unknown", f"mostly {top}, which no parallelism is known by"
    if world_size and nranks == world_size:
        return "data-parallel", f"reductions/gathers over all {world_size} ranks of the job"
    if members and len(members) > 1:
        steps = {b - a for a, b in zip(members, members[1:])}
        if steps == {1}:
            return "tensor-parallel", f"reductions/gathers on {len(members)} consecutive ranks"
        if len(steps) == 1:
            return "data-parallel", f"reductions/gathers on ranks strided by {steps.pop()}"
    if world_size and nranks and nranks < world_size:
        return "unknown", f"reductions/gathers on {nranks} of {world_size} ranks, members unknown"
    return "unknown", "size or members unknown"


def build_communicators(rows: list[MixRow], job_calls: list[JobCall], infos: dict[str, Any],
                        world_size: int | None) -> dict[str, Communicator]:
    by_comm: dict[str, list[CollectiveCall]] = defaultdict(list)
    kinds: dict[str, Counter] = defaultdict(Counter)
    for j in job_calls:
        by_comm[j.communicator].extend(j.records)
        kinds[j.communicator][j.collective] += 1
    out: dict[str, Communicator] = {}
    for comm in sorted(by_comm, key=lambda c: -len(by_comm[c])):
        info = infos.get(comm)
        members = _members(comm, info, by_comm[comm])
        nranks = (getattr(info, "nranks", None) or (len(members) if members else None)
                  or next((c.nranks for c in by_comm[comm] if c.nranks), None))
        role, why = guess_role(nranks, members, kinds[comm], world_size)
        mine = [r for r in rows if r.communicator == comm]
        times = [r.time_us for r in mine if r.time_us is not None]
        out[comm] = Communicator(comm, nranks, members, getattr(info, "name", None), role, why,
                                 sum(times) if times else None, sum(r.bytes_total or 0 for r in mine),
                                 sum(r.job_calls for r in mine))
    return out


# --- iterations ---------------------------------------------------------------------------------

def detect_iterations(job_calls: list[JobCall]) -> Iterations | None:
    """Iterations as a repeating sequence of calls: the longest-traced rank's sequence
    of (communicator, collective, bytes) must repeat a block of at least
    MIN_ITERATION_CALLS calls at least twice in full after its warm-up
    (`collc.profile.iterations`). None when no such repetition exists."""
    per_rank: dict[Any, list[int]] = defaultdict(list)
    codes: dict[tuple, int] = {}
    # job_calls are in issue order: each rank's list comes out in that order.
    for j in job_calls:
        sig = (j.communicator, j.collective, j.first.bytes)
        code = codes.get(sig)
        if code is None:
            code = codes[sig] = len(codes)
        records = j.records
        if len(records) == 1:
            per_rank[rank_key(records[0])].append(code)
        else:
            for c in records:
                per_rank[rank_key(c)].append(code)
    if not per_rank:
        return None
    found = find_iterations(max(per_rank.values(), key=len))
    if found is None:
        return None
    repeats, period, warmup = found
    return Iterations(repeats, period, warmup, "repeating call sequence")


# --- entry point ----------------------------------------------------------------------------------

def build_mix(calls: Sequence[CollectiveCall], world_size: int | None = None,
              communicators: dict[str, Any] | None = None, notes: Sequence[str] = ()) -> Mix:
    """The mix of a job from its ranks' call records (see the module docstring).

    Run with the cyclic garbage collector paused: the mix makes a job call (and its
    list) per record and keeps them all, none is garbage, yet every collection while
    they are made walks every record read so far: it took 60% of the mix's time on a
    log of 300,000 records (as in the reader: `nccl_log.sequential.scan_batch`)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _build_mix(calls, world_size, communicators, notes)
    finally:
        if enabled:
            gc.enable()


def _build_mix(calls: Sequence[CollectiveCall], world_size: int | None,
               communicators: dict[str, Any] | None, notes: Sequence[str]) -> Mix:
    job_calls = match_calls(calls)
    rows = build_rows(job_calls)
    if world_size is None:  # the largest communicator, or the highest rank seen
        sizes = [c.nranks for c in calls if c.nranks] + [i.nranks for i in (communicators or {}).values()
                                                          if getattr(i, "nranks", None)]
        seen = {c.rank for c in calls if c.rank is not None}
        world_size = max(sizes + [max(seen) + 1 if seen else 0]) or None
    comms = build_communicators(rows, job_calls, communicators or {}, world_size)
    for row in rows:  # a row's size is its communicator's where the records did not say
        if row.nranks is None and comms[row.communicator].nranks:
            row.nranks = comms[row.communicator].nranks
    mix = Mix(rows, comms, world_size, detect_iterations(job_calls), job_calls, list(notes))
    unnamed = sum(r.named_by.get("launch-op", 0) for r in rows)
    if unnamed and not any("nccl:*" in n for n in notes):  # the readers may have said it already
        mix.notes.append(f"{unnamed} call record(s) carried no collective metadata and are named by the "
                         "nccl:* operator that launched them (named_by launch-op)")
    partial = [r for r in rows if r.nranks and len(r.ranks) < r.nranks and r.collective not in P2P]
    if partial:
        seen = max(len(r.ranks) for r in partial)
        mix.notes.append(f"traces of at most {seen} rank(s) per communicator were given; latency and straggler "
                         "time are over the traced ranks only")
    if mix.iterations is None:
        mix.notes.append("no iterations detected (no repeating call sequence): per-iteration figures are for "
                         "the whole trace")
    return mix


def per_iteration(mix: Mix) -> float:
    """Job calls are divided by this to give per-iteration figures."""
    return float(mix.iterations.count) if mix.iterations else 1.0


def human_bytes(n: int | float | None) -> str:
    """`1.5 KiB`, `64 MiB`, `?` for an unknown size (rounded: `collc.units.format_bytes`)."""
    return "?" if n is None else format_bytes(n, exact=False)
