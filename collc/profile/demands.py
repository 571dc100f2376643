"""The demand matrix of every AllToAll a PyTorch profile recorded (`collc profile --demands DIR`).

PyTorch's `record_param_comms` CPU ops (Kineto traces) carry, for `all_to_all` and
`all_to_allv` (torch.distributed.all_to_all_single with split sizes: a mixture-of-
experts layer's token exchange), `"In split size"` and `"Out split size"`: the elements
the rank sends to, and receives from, each rank of the process group, in group order
(strings such as "[1024, 0, 2048, 512]"; "[]" where the split is even). With `dtype`'s
element size, rank r's in-splits are row r of the call's demand matrix, and its
out-splits column r.

Calls are matched across the per-rank files of a job by process group and order (the
k-th AllToAll of group g on every rank is one call). Each call whose every row is
present becomes `DIR/alltoall-<group>-<k>.csv`, in bytes, as `collc compile --demand`
reads it; a row comes from the sender's in-splits, and where the receivers'
out-splits disagree with it the call is listed as inconsistent and not written. An even
split ("[]") is In msg nelems / group size to every rank.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from collc.diagnostics import CollcError
from collc.io import atomic_write
from collc.traces.chrome import ChromeTrace
from collc.traces.detect import detect
from collc.traces.kineto import DTYPES
from collc.traces.sources import trace_files

ALL_TO_ALL = frozenset({"all_to_all", "all_to_allv", "alltoall", "alltoall_base", "all_to_all_single"})
_SAFE = re.compile(r"[^A-Za-z0-9_.=-]")


@dataclass(frozen=True)
class SplitCall:
    """One rank's record of one AllToAll."""

    rank: int  # the rank's place in its process group
    group: str
    group_ranks: tuple[int, ...]
    element_bytes: int
    sent: tuple[int, ...]  # elements to each rank of the group
    received: tuple[int, ...]  # elements from each rank of the group
    ts: float


@dataclass
class DemandCall:
    group: str
    index: int
    matrix: np.ndarray  # bytes, N x N
    consistent: bool
    missing_rows: list[int] = field(default_factory=list)

    def file_name(self) -> str:
        return f"alltoall-{_SAFE.sub('_', self.group)}-{self.index}.csv"


def _splits(value: Any) -> list[int] | None:
    if isinstance(value, list):
        items = value
    elif isinstance(value, str):
        try:
            items = json.loads(value)
        except ValueError:
            return None
    else:
        return None
    if not isinstance(items, list) or not all(isinstance(x, (int, float)) and x >= 0 for x in items):
        return None
    return [int(x) for x in items]


def _ranks(value: Any) -> tuple[int, ...] | None:
    parsed = _splits(value)
    return tuple(parsed) if parsed is not None else None


def split_calls(path: str | Path) -> list[SplitCall]:
    """The AllToAll records of one rank's Kineto trace, in time order."""
    trace = ChromeTrace(path)
    out = []
    events = [e for e in trace.events((b"record_param_comms",)) if e.get("name") == "record_param_comms"
              and (e.get("args") or {}).get("Collective name") in ALL_TO_ALL]
    # distributedInfo may come after traceEvents: metadata is complete once they are read.
    info = trace.metadata.get("distributedInfo")
    global_rank = info.get("rank") if isinstance(info, dict) else None
    for event in events:
        args = event.get("args") or {}
        size = DTYPES.get(str(args.get("dtype")), (None, None))[1]
        group_ranks = _ranks(args.get("Process Group Ranks")) or ()
        group_size = int(args.get("Group size") or len(group_ranks) or 0)
        sent, received = _splits(args.get("In split size")), _splits(args.get("Out split size"))
        if size is None or group_size < 2 or sent is None or received is None:
            continue
        if not sent:  # even split
            sent = [int(args.get("In msg nelems") or 0) // group_size] * group_size
        if not received:
            received = [int(args.get("Out msg nelems") or 0) // group_size] * group_size
        if len(sent) != group_size or len(received) != group_size:
            continue
        rank = group_ranks.index(global_rank) if global_rank in group_ranks else global_rank
        if not isinstance(rank, int) or not 0 <= rank < group_size:
            continue
        group = str(args.get("Process Group Name") or args.get("pg_name") or "default")
        out.append(SplitCall(rank, group, group_ranks or tuple(range(group_size)), size, tuple(sent),
                             tuple(received), float(event.get("ts") or 0.0)))
    return sorted(out, key=lambda c: c.ts)


def demand_calls(records: Iterable[list[SplitCall]]) -> list[DemandCall]:
    """Per-rank records (one list per file) matched into calls: the k-th AllToAll of
    a group on every rank."""
    by_group: dict[str, dict[int, list[SplitCall]]] = {}
    for calls in records:
        counters: dict[str, int] = {}
        for c in calls:
            k = counters.get(c.group, 0)
            counters[c.group] = k + 1
            by_group.setdefault(c.group, {}).setdefault(k, []).append(c)
    out = []
    for group in sorted(by_group):
        for k in sorted(by_group[group]):
            rows = by_group[group][k]
            n = len(rows[0].sent)
            matrix = np.zeros((n, n))
            columns = np.full((n, n), np.nan)
            seen = set()
            for c in rows:
                if len(c.sent) != n or c.rank in seen:
                    continue
                seen.add(c.rank)
                matrix[c.rank, :] = np.array(c.sent, dtype=float) * c.element_bytes
                columns[:, c.rank] = np.array(c.received, dtype=float) * c.element_bytes
            missing = sorted(set(range(n)) - seen)
            known = ~np.isnan(columns)
            consistent = not missing and bool(np.all(columns[known] == matrix[known]))
            out.append(DemandCall(group, k, matrix, consistent, missing))
    return out


def write_demands(traces: list[str | Path], directory: Path) -> list[DemandCall]:
    """Every complete, consistent AllToAll of the traces as a CSV in `directory` (the
    caller's all_or_nothing block decides whether they land); returns all calls."""
    kineto = [p for p in trace_files(traces) if detect(p) == "kineto"]
    calls = demand_calls(split_calls(p) for p in kineto)
    if not calls:
        raise CollcError("no all_to_all with In split size / Out split size in "
                         + ", ".join(str(p) for p in traces) + " (record_param_comms of a PyTorch profile)")
    if directory.exists() and not directory.is_dir():
        raise CollcError(f"--demands {directory}: a file, not a directory")
    directory.mkdir(parents=True, exist_ok=True)
    for call in calls:
        if call.consistent:
            lines = [f"# {call.group} all_to_all #{call.index}: bytes rank i sends rank j"]
            lines += [",".join(f"{b:.0f}" for b in row) for row in call.matrix]
            atomic_write(directory / call.file_name(), "\n".join(lines) + "\n")
    return calls
