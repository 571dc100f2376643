"""`read_nccl_log_columns`: an NCCL log's calls as columns, read by several processes
where that pays (`parallel`), else in this process (`sequential`); the same records
either way. `read_nccl_log`: the same calls as records."""

from __future__ import annotations

from collections import deque
from typing import Iterator

from ..columns import CallColumns, from_columns
from ..detect import TraceSource
from ..records import CollectiveCall, SourceSummary, TraceContext
from .parallel import read_split
from .scan import State, finish
from .sequential import read_stream


def read_nccl_log_columns(source: TraceSource, summary: SourceSummary, context: TraceContext) -> CallColumns:
    state = State(source.name, summary, context)
    split = read_split(source, state)
    if split is not None:
        # The split read merges one piece into `state` per step it is advanced: run it
        # to the end (it yields nothing of its own).
        deque(split, maxlen=0)
    else:
        with source.open() as f:
            read_stream(f, state)
    finish(state)
    return state.collected.columns(source.name)


def read_nccl_log(source: TraceSource, summary: SourceSummary, context: TraceContext
                  ) -> Iterator[CollectiveCall]:
    yield from from_columns(read_nccl_log_columns(source, summary, context))
