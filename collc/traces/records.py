"""What every trace reader produces: one `CollectiveCall` per rank per call.

Readers stream: each yields calls as it reads and counts what it skipped (and why) in
a `SourceSummary`, so a trace of gigabytes never has to fit in memory as a whole.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

# Collective names as the standard library spells them (lower case).
COLLECTIVES = ("allreduce", "allgather", "reducescatter", "alltoall", "broadcast", "reduce",
               "gather", "scatter", "send", "recv")
# Named only by an NCCL kernel's name (`collectives.kernel_name_collective`): a SendRecv
# kernel's transfers, a Generic kernel's work; never synthesized, only reported.
KERNEL_ONLY = ("sendrecv", "generic", "nccl-kernel")


# Not frozen: readers create millions of these, and a frozen dataclass's __init__ costs
# three times as much. Treat records as immutable all the same (they are hashable).
@dataclass(slots=True, unsafe_hash=True)
class CollectiveCall:
    """One rank's record of one collective (or point-to-point) call.

    `bytes` is nccl-tests' size (reference section 4): the output buffer for AllGather
    and Gather, the input buffer for ReduceScatter and Scatter, the buffer for the rest.
    Times are microseconds on the recording rank's clock; None where the trace has none.
    """

    source: str                      # the file it was read from
    location: str                    # "line 812" or "event 5031": where in that file
    collective: str                  # one of COLLECTIVES (or KERNEL_ONLY)
    rank: int | None = None          # global rank of the recording process
    communicator: str | None = None  # communicator id or process-group name
    nranks: int | None = None        # communicator size
    dtype: str | None = None         # "float32", "bfloat16", ...
    count: int | None = None         # elements, as the trace states them
    bytes: int | None = None         # nccl-tests' size in bytes
    seq: int | None = None           # per-communicator sequence number (opCount, Seq)
    start_us: float | None = None
    duration_us: float | None = None
    peer: int | None = None          # Send/Recv: the other rank
    algorithm: str | None = None     # NCCL's choice where logged (Ring, Tree, ...)
    protocol: str | None = None      # LL, LL128, Simple
    group_ranks: tuple[int, ...] | None = None  # member global ranks, where known
    named_by: str = "metadata"       # "metadata", "log", "launch-op" (named by the nccl:* op)
    #                                  or "kernel-name" (an NCCL kernel with nothing else)
    in_bytes: int | None = None      # this rank's send buffer, as recorded
    out_bytes: int | None = None     # this rank's receive buffer, as recorded
    # `bytes` stays None where it needs the communicator size and that is unknown (an
    # AllGather named by its launching op: in_bytes x nranks); in/out_bytes then say what is known.


@dataclass
class SourceSummary:
    """What a reader made of one file: its format, records read, and records skipped by reason."""

    path: str
    format: str
    records: int = 0
    skipped: Counter = field(default_factory=Counter)
    # reason -> the first line numbers (or record numbers) skipped for it, where known
    skipped_at: dict[str, list[int]] = field(default_factory=dict)

    def skip(self, reason: str, n: int = 1) -> None:
        self.skipped[reason] += n

    def to_json(self) -> dict:
        out = {"path": self.path, "format": self.format, "records": self.records,
               "skipped": dict(sorted(self.skipped.items()))}
        if self.skipped_at:
            out["skipped_at"] = {k: list(v) for k, v in sorted(self.skipped_at.items())}
        return out


@dataclass
class CommunicatorInfo:
    """A communicator (NCCL comm or PyTorch process group) as the traces describe it."""

    id: str
    nranks: int | None = None
    ranks: tuple[int, ...] | None = None   # member global ranks, where known
    name: str | None = None                # process-group name / description

    def merge(self, nranks: int | None = None, ranks: tuple[int, ...] | None = None,
              name: str | None = None) -> None:
        """Fill what this record does not know yet from another file's view of it."""
        if self.nranks is None and nranks is not None:
            self.nranks = nranks
        if self.ranks is None and ranks is not None:
            self.ranks = tuple(ranks)
            if self.nranks is None:
                self.nranks = len(self.ranks)
        if self.name is None and name is not None:
            self.name = name


@dataclass
class TraceContext:
    """What readers learn besides calls: world size, communicators and notes for the user.

    One context is shared by every file of a `read_traces` call, so that what one rank's
    file says about a communicator completes what another's said.
    """

    world_size: int | None = None
    communicators: dict[str, CommunicatorInfo] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def communicator(self, comm_id: str, nranks: int | None = None,
                     ranks: tuple[int, ...] | None = None, name: str | None = None) -> CommunicatorInfo:
        info = self.communicators.get(comm_id)
        if info is None:
            info = self.communicators[comm_id] = CommunicatorInfo(comm_id)
        info.merge(nranks, ranks, name)
        return info

    def saw_world_size(self, n: int | None) -> None:
        if n is not None and (self.world_size is None or n > self.world_size):
            self.world_size = n
