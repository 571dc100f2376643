"""The garbage collector, paused while collc builds millions of small objects.

A compile at scale allocates millions of tuples (ops, slots, chunk sets) and frees
almost none of them until it ends. CPython's default thresholds then run a collection
every 700 allocations and a full one each time the heap grows by a quarter: at 1,024
ranks that was 85% of the time spent building a collective. Raising the thresholds
(a young collection every 100,000 allocations) still left every object traversed by a
young and a middle collection: 0.8 of the 1.3 CPU seconds that building an AllReduce
on 1,024 ranks took. Inside `few_collections()` the cycle collector does not run at
all: the data built has no reference cycles (reference counting frees it), and any
cyclic garbage made meanwhile is collected by a later full collection.

Leaving the block does not let the collector loose on what it built either. The
collector counts allocations while it is off, so the first allocation after turning it
on again starts a young collection, and every object made in the block is young: at
1,024 ranks that one collection walked the millions of ops, halves and steps a compile
keeps (5 s). On leaving, the block's survivors are therefore moved straight to the
oldest generation without a scan (`gc.freeze()` then `gc.unfreeze()`: two list splices),
where only a full collection looks at them, as it would once they had survived two
younger ones. (Not in a program that froze objects itself: see `_to_oldest_generation`.)
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def few_collections() -> Iterator[None]:
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            _to_oldest_generation()
            gc.enable()


def _to_oldest_generation() -> None:
    """Every object the collector tracks into its oldest generation, unscanned; resets
    the young generation's allocation count (gc.freeze does). Not where the program
    froze objects itself (unfreezing would hand those back to the collector): the
    collector then runs as it would have."""
    if gc.get_freeze_count():
        return
    gc.freeze()
    gc.unfreeze()
