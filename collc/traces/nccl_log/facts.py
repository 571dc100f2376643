"""What an NCCL log says besides its calls: NCCL's version, the communicators its INIT
lines describe (size, the ranks and nodes seen), and its TUNING output.

A log written with `NCCL_DEBUG=INFO` alone has INIT lines and no COLL line (COLL is not
among NCCL's default subsystems), so it has no call to profile; `collc profile` still
tells what it can from it. This is a separate, simple pass over the file, made only for
such logs, so the reader's hot path does not carry it.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

from ..detect import TraceSource

_VERSION = re.compile(rb"NCCL version (?P<v>\S+)")
_INIT = re.compile(rb"(?P<host>[^\s:\]\[()]+):(?P<pid>\d+):\d+ \[\d+\] NCCL INFO (?:\w+ )?comm (?P<ptr>0x[0-9a-fA-F]+) "
                   rb"rank (?P<rank>\d+) n[Rr]anks (?P<nranks>\d+)[^\n]*?commId (?P<id>0x[0-9a-fA-F]+)")
# A TUNING line NCCL logs per call (`AllReduce: 8 Bytes -> Algo RING proto SIMPLE ...`).
_TUNING = re.compile(rb"NCCL INFO (?:(?P<op>[A-Za-z]+): )?(?P<bytes>\d+) Bytes -> Algo (?P<algo>\w+) proto (?P<proto>\w+)")
# The model table NCCL prints at init with the TUNING subsystem: rows of `|`-separated
# columns headed `Algorithm`, `Protocol`, `Max NThreads` or a collective's name.
_TABLE = re.compile(rb"(?P<who>[^\s]*:\d+:\d+ \[\d+\]) NCCL INFO (?P<row>\s*(?:Algorithm|Protocol|Max NThreads|[A-Z][A-Za-z]+)\s+\|[^\n]*)")


@dataclass
class CommFacts:
    id: str
    nranks: int
    ranks: set[int] = field(default_factory=set)
    hosts: set[str] = field(default_factory=set)


@dataclass
class LogFacts:
    versions: list[str] = field(default_factory=list)
    communicators: dict[str, CommFacts] = field(default_factory=dict)
    tunings: Counter = field(default_factory=Counter)   # (collective or "", bytes, algo, proto) -> lines
    table: list[str] = field(default_factory=list)        # the init-time TUNING table, one rank's
    table_writer: bytes | None = None                     # the thread whose table that is

    def to_json(self) -> dict:
        return {"nccl_versions": self.versions,
                "communicators": [{"id": c.id, "nranks": c.nranks, "ranks_seen": sorted(c.ranks),
                                   "nodes": sorted(c.hosts)} for c in self.communicators.values()],
                "tuning": [{"collective": k[0] or None, "bytes": k[1], "algorithm": k[2], "protocol": k[3],
                            "lines": n} for k, n in sorted(self.tunings.items())],
                "tuning_table": self.table}


def log_facts(source: TraceSource) -> LogFacts:
    """The facts of one (plain or gzip) NCCL log, read line by line."""
    facts = LogFacts()
    with source.open() as f:
        for line in f:
            if b"NCCL" not in line:
                continue
            _take(line, facts)
    return facts


def _take(line: bytes, facts: LogFacts) -> None:
    v = _VERSION.search(line)
    if v:
        version = v.group("v").decode(errors="replace")
        if version not in facts.versions:
            facts.versions.append(version)
        return
    i = _INIT.search(line)
    if i:
        cid = i.group("id").decode()
        comm = facts.communicators.setdefault(cid, CommFacts(cid, int(i.group("nranks"))))
        comm.ranks.add(int(i.group("rank")))
        comm.hosts.add(i.group("host").decode(errors="replace"))
        return
    t = _TUNING.search(line)
    if t:
        op = (t.group("op") or b"").decode()
        facts.tunings[(op, int(t.group("bytes")), t.group("algo").decode(), t.group("proto").decode())] += 1
        return
    row = _TABLE.search(line)
    if row:
        # Every rank prints its table: the first thread's is shown.
        if facts.table_writer is None:
            facts.table_writer = row.group("who")
        if row.group("who") == facts.table_writer:
            facts.table.append(row.group("row").rstrip().decode(errors="replace"))
