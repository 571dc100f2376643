"""`read_nccl_log`: an NCCL log's calls, read by several processes where that pays
(`parallel`), else in this process (`sequential`); the same records either way."""

from __future__ import annotations

from typing import Iterator

from ..detect import TraceSource
from ..records import CollectiveCall, SourceSummary, TraceContext
from .parallel import read_split
from .scan import State, finish
from .sequential import read_stream


def read_nccl_log(source: TraceSource, summary: SourceSummary, context: TraceContext
                  ) -> Iterator[CollectiveCall]:
    state = State(source.name, summary, context)
    split = read_split(source, state)
    if split is not None:
        for calls in split:       # lists, not calls: one generator less for each call to pass
            yield from calls
    else:
        with source.open() as f:
            for calls in read_stream(f, state):
                yield from calls
    yield from finish(state)
