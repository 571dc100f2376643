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
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Sequence

import numpy as np

from collc.profile.iterations import MAX_WARMUP, MIN_ITERATION_CALLS, find_iterations  # noqa: F401 (re-exported: they were defined here)
from collc.profile.matching import (JobCall, Matched, dense_key, first_ids, first_per_group, match,  # noqa: F401 (JobCall, rank_key: re-exported)
                                    rank_key, unique_first)
from collc.traces.columns import CallColumns, to_columns
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
    matched: Matched          # the job calls, as ids over the records' columns
    notes: list[str] = field(default_factory=list)
    combined: str = COMBINE_NOTE

    @property
    def job_call_count(self) -> int:
        return self.matched.count

    @cached_property
    def job_calls(self) -> list[JobCall]:
        """The job calls as objects, records and all (made when first asked for: the
        table and the iterations need only the ids)."""
        return self.matched.job_calls()

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

def communicator_key(call: CollectiveCall) -> str:
    return call.communicator if call.communicator is not None else "?"


def match_calls(calls: Sequence[CollectiveCall]) -> list[JobCall]:
    """Group the records of one call made by several ranks into one `JobCall`, in issue
    order (`collc.profile.matching`)."""
    return match(to_columns(calls)).job_calls(calls)


# --- the table ----------------------------------------------------------------------------

def build_rows(m: Matched) -> list[MixRow]:
    """One row per (communicator, collective, dtype, bytes) of the job calls, in the order
    of each row's first job call; every sum taken in job-call order."""
    r, first, count = m.records, m.first, m.count
    sizes_of = m.columns.ints["bytes"]
    row, row_first_job = first_ids(dense_key([m.comm, m.collective, r.dtype[first], r.bytes_none[first],
                                              r.bytes[first]], count))
    rows_n = len(row_first_job)
    record_row = row[m.job]
    calls = np.bincount(record_row, minlength=rows_n).tolist()
    job_calls = np.bincount(row, minlength=rows_n).tolist()
    # nranks: the first job call's (in order) that says, each job call's being its first record's that says.
    ordered = m.order
    ordered_nranks = r.nranks[ordered]
    job_nranks = first_per_group(m.job[ordered], ordered_nranks, ordered_nranks != 0, count)
    nranks = first_per_group(row, job_nranks, job_nranks != 0, rows_n).tolist()
    latency, straggler, timed = _job_times(m)
    timed_jobs = np.flatnonzero(timed)
    timed_calls = np.bincount(row[timed_jobs], minlength=rows_n).tolist()
    time_us = np.bincount(row[timed_jobs], weights=latency[timed_jobs], minlength=rows_n).tolist()
    straggler_us = np.bincount(row[timed_jobs], weights=straggler[timed_jobs], minlength=rows_n).tolist()
    out: list[MixRow] = []
    for i, j in enumerate(row_first_job.tolist()):
        f = first[j]
        size = None if r.bytes_none[f] else int(sizes_of[f])
        timed_here = timed_calls[i] > 0
        out.append(MixRow(r.comms[m.comm[j]], r.collectives[m.collective[j]], r.dtypes[r.dtype[f]], size,
                          nranks[i] or None, calls=calls[i], job_calls=job_calls[i], timed_calls=timed_calls[i],
                          time_us=time_us[i] if timed_here else None,
                          straggler_us=straggler_us[i] if timed_here else None))
    _fill_sets(out, m, record_row)
    return out


def _job_times(m: Matched) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(latency, straggler, timed) per job call: the shortest duration of its records,
    longest - shortest (0.0 for a job call of one record), whether any is timed."""
    r, count = m.records, m.count
    has = ~r.duration_none
    jobs, durations = m.job[has], r.duration[has]
    latency = np.full(count, np.inf)
    longest = np.full(count, -np.inf)
    np.minimum.at(latency, jobs, durations)
    np.maximum.at(longest, jobs, durations)
    timed = np.bincount(jobs, minlength=count) > 0
    with np.errstate(invalid="ignore"):
        straggler = np.where(m.sizes() == 1, 0.0, longest - latency)
    return latency, straggler, timed


def _fill_sets(rows: list[MixRow], m: Matched, record_row: np.ndarray) -> None:
    """Each row's ranks, peers and named_by counts: from the distinct (row, value) pairs."""
    r = m.records
    n = r.n
    firsts = unique_first(dense_key([record_row, r.rank_key], n))[1]
    for i, k in zip(record_row[firsts].tolist(), r.rank_key[firsts].tolist()):
        rows[i].ranks.add(r.rank_keys[k])
    key = dense_key([record_row, r.named_by], n)
    _, firsts, _, counts = unique_first(key, counts=True)
    for i, k, c in zip(record_row[firsts].tolist(), r.named_by[firsts].tolist(), counts.tolist()):
        rows[i].named_by[r.named[k]] += c
    with_peer = np.flatnonzero(~r.peer_none)
    if len(with_peer):
        key = dense_key([record_row[with_peer], r.peer[with_peer]], len(with_peer))
        firsts = unique_first(key)[1]
        for i, p in zip(record_row[with_peer][firsts].tolist(), r.peer[with_peer][firsts].tolist()):
            rows[i].peers.add(p)


# --- communicators and their roles ----------------------------------------------------------

def _members(info: Any, first_group: tuple[int, ...] | None) -> tuple[int, ...] | None:
    if info is not None and getattr(info, "ranks", None):
        return tuple(info.ranks)
    return tuple(first_group) if first_group else None


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


def build_communicators(rows: list[MixRow], m: Matched, infos: dict[str, Any],
                        world_size: int | None) -> dict[str, Communicator]:
    """The communicators of the job calls, most records first (ties: first called first)."""
    r = m.records
    comms = r.comms
    job_comm = m.comm
    _, first_jobs = first_ids(job_comm)
    records = np.bincount(r.comm, minlength=len(comms))
    kinds = _kinds(m)
    ordered = m.order
    ordered_comm = r.comm[ordered]
    ordered_nranks = r.nranks[ordered]
    first_nranks = first_per_group(ordered_comm, ordered_nranks, ordered_nranks != 0, len(comms)).tolist()
    groups = _first_groups(m)
    out: dict[str, Communicator] = {}
    for code in sorted(job_comm[first_jobs].tolist(), key=lambda c: -records[c]):
        comm = comms[code]
        info = infos.get(comm)
        members = _members(info, groups.get(code))
        nranks = (getattr(info, "nranks", None) or (len(members) if members else None) or first_nranks[code]
                  or None)
        role, why = guess_role(nranks, members, kinds[code], world_size)
        mine = [row for row in rows if row.communicator == comm]
        times = [row.time_us for row in mine if row.time_us is not None]
        out[comm] = Communicator(comm, nranks, members, getattr(info, "name", None), role, why,
                                 sum(times) if times else None, sum(row.bytes_total or 0 for row in mine),
                                 sum(row.job_calls for row in mine))
    return out


def _kinds(m: Matched) -> dict[int, Counter]:
    """Per communicator code, its job calls per collective (first called first)."""
    r = m.records
    pair, firsts = first_ids(dense_key([m.comm, m.collective], m.count))
    counts = np.bincount(pair, minlength=len(firsts)).tolist()
    kinds: dict[int, Counter] = defaultdict(Counter)
    for j, n in zip(firsts.tolist(), counts):
        kinds[int(m.comm[j])][r.collectives[m.collective[j]]] = n
    return kinds


def _first_groups(m: Matched) -> dict[int, tuple[int, ...]]:
    """Per communicator code, the members named by its first record (in job-call order)
    that names them."""
    r = m.records
    named = [(int(m.job[i]), i) for i, g in r.group_ranks.items() if g]
    out: dict[int, tuple[int, ...]] = {}
    for _, i in sorted(named):
        out.setdefault(int(r.comm[i]), r.group_ranks[i])
    return out


# --- iterations ---------------------------------------------------------------------------------

def detect_iterations(m: Matched) -> Iterations | None:
    """Iterations as a repeating sequence of calls: the longest-traced rank's sequence
    of (communicator, collective, bytes) must repeat a block of at least
    MIN_ITERATION_CALLS calls at least twice in full after its warm-up
    (`collc.profile.iterations`). None when no such repetition exists. The longest
    rank is the first seen (in job-call order) of those with the most records."""
    r = m.records
    if r.n == 0:
        return None
    first = m.first
    signature, _ = first_ids(dense_key([m.comm, m.collective, r.bytes_none[first], r.bytes[first]], m.count))
    ordered = m.order
    rank = r.rank_key[ordered]
    counts = np.bincount(rank)
    seen, first_seen, _ = unique_first(rank)
    most = seen[counts[seen] == counts.max()]
    longest = most[np.argmin(first_seen[np.isin(seen, most)])]
    found = find_iterations(signature[m.job[ordered[rank == longest]]])
    if found is None:
        return None
    repeats, period, warmup = found
    return Iterations(repeats, period, warmup, "repeating call sequence")


# --- entry point ----------------------------------------------------------------------------------

def build_mix(calls: Sequence[CollectiveCall] | CallColumns, world_size: int | None = None,
              communicators: dict[str, Any] | None = None, notes: Sequence[str] = ()) -> Mix:
    """The mix of a job from its ranks' call records (see the module docstring), given
    as records or as their columns (`collc.traces.columns`: what the readers give; the
    records are then never made).

    Run with the cyclic garbage collector paused: columns made of records keep a tuple
    per record until done, and every collection meanwhile would walk them all."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        columns = calls if isinstance(calls, CallColumns) else to_columns(calls)
        return _build_mix(columns, world_size, communicators, notes)
    finally:
        if enabled:
            gc.enable()


def _build_mix(columns: CallColumns, world_size: int | None,
               communicators: dict[str, Any] | None, notes: Sequence[str]) -> Mix:
    m = match(columns)
    rows = build_rows(m)
    if world_size is None:
        world_size = _world_size(m, communicators or {})
    comms = build_communicators(rows, m, communicators or {}, world_size)
    for row in rows:  # a row's size is its communicator's where the records did not say
        if row.nranks is None and comms[row.communicator].nranks:
            row.nranks = comms[row.communicator].nranks
    mix = Mix(rows, comms, world_size, detect_iterations(m), m, list(notes))
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


def _world_size(m: Matched, communicators: dict[str, Any]) -> int | None:
    """The largest communicator, or the highest rank seen plus one."""
    cols = m.columns
    sizes = [int(m.records.nranks[m.records.nranks != 0].max())] if (m.records.nranks != 0).any() else []
    sizes += [i.nranks for i in communicators.values() if getattr(i, "nranks", None)]
    ranked = ~cols.int_none["rank"]
    seen = int(cols.ints["rank"][ranked].max()) + 1 if ranked.any() else 0
    return max(sizes + [seen]) or None


def per_iteration(mix: Mix) -> float:
    """Job calls are divided by this to give per-iteration figures."""
    return float(mix.iterations.count) if mix.iterations else 1.0


def human_bytes(n: int | float | None) -> str:
    """`1.5 KiB`, `64 MiB`, `?` for an unknown size (rounded: `collc.units.format_bytes`)."""
    return "?" if n is None else format_bytes(n, exact=False)
