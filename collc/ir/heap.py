"""The garbage collector, tuned while collc builds millions of small objects.

A compile at scale allocates millions of tuples (ops, slots, chunk sets) and frees
almost none of them until it ends. CPython's default thresholds then run a collection
every 700 allocations and a full one each time the heap grows by a quarter: at 1,024
ranks that was 85% of the time spent building a collective. Inside `few_collections()`
young collections run a hundred times less often; the data built has no reference
cycles, so nothing collectable waits longer than it would anyway.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

YOUNG_THRESHOLD = 100_000
MIDDLE_THRESHOLD = 50
OLD_THRESHOLD = 1_000


@contextmanager
def few_collections() -> Iterator[None]:
    old = gc.get_threshold()
    gc.set_threshold(max(old[0], YOUNG_THRESHOLD), max(old[1], MIDDLE_THRESHOLD), max(old[2], OLD_THRESHOLD))
    try:
        yield
    finally:
        gc.set_threshold(*old)
