"""The MSCCL XML program as data: what the writer builds and the reader returns.

Enum values are the tokens the XML uses, so serializing is `member.value`. See
docs/msccl-xml.md (and the runtimes' parser) for the rules a program must follow.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class StepType(str, Enum):
    SEND = "s"
    RECV = "r"
    RECV_COPY_SEND = "rcs"
    RECV_REDUCE_SEND = "rrs"
    RECV_REDUCE_COPY = "rrc"
    RECV_REDUCE_COPY_SEND = "rrcs"
    COPY = "cpy"
    REDUCE = "re"
    NOP = "nop"

    # Sets rather than tuples: a tuple test compares with == member by member, and the
    # simulator asks these per step.
    @property
    def sends(self) -> bool:
        return self in _SENDS

    @property
    def receives(self) -> bool:
        return self in _RECEIVES

    @property
    def reduces(self) -> bool:
        return self in _REDUCES


_SENDS = frozenset((StepType.SEND, StepType.RECV_COPY_SEND, StepType.RECV_REDUCE_SEND,
                    StepType.RECV_REDUCE_COPY_SEND))
_RECEIVES = frozenset((StepType.RECV, StepType.RECV_COPY_SEND, StepType.RECV_REDUCE_SEND,
                       StepType.RECV_REDUCE_COPY, StepType.RECV_REDUCE_COPY_SEND))
_REDUCES = frozenset((StepType.RECV_REDUCE_SEND, StepType.RECV_REDUCE_COPY, StepType.RECV_REDUCE_COPY_SEND,
                      StepType.REDUCE))


class BufferName(str, Enum):
    INPUT = "i"
    OUTPUT = "o"
    SCRATCH = "s"


class Protocol(str, Enum):
    SIMPLE = "Simple"
    LL = "LL"
    LL128 = "LL128"


@dataclass(slots=True)  # millions of them at 1,024 GPUs: no per-object dict
class XmlStep:
    s: int
    type: StepType
    srcbuf: BufferName | None
    srcoff: int
    dstbuf: BufferName | None
    dstoff: int
    cnt: int
    depid: int = -1
    deps: int = -1
    hasdep: bool = False
    line: int | None = None  # where the reader found it, for messages


@dataclass(slots=True)
class XmlThreadblock:
    id: int
    send: int
    recv: int
    chan: int
    steps: list[XmlStep] = field(default_factory=list)
    line: int | None = None


@dataclass(slots=True)
class XmlGpu:
    id: int
    i_chunks: int
    o_chunks: int
    s_chunks: int
    tbs: list[XmlThreadblock] = field(default_factory=list)
    line: int | None = None


@dataclass
class XmlAlgo:
    name: str
    proto: Protocol
    nchannels: int
    nchunksperloop: int
    ngpus: int
    coll: str
    inplace: bool
    outofplace: bool | None  # None: the attribute is missing (the current executor skips such a file)
    min_bytes: int | None
    max_bytes: int | None
    gpus: list[XmlGpu] = field(default_factory=list)
    # Attributes the reader saw but does not model, kept for round trips.
    extra_attrs: dict[str, str] = field(default_factory=dict)
    line: int | None = None  # where the reader found <algo>
