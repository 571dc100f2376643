"""Iterations of a training job as a repeating sequence of calls, found in a few passes.

The definition (unchanged from the per-offset search it replaces): the answer is the
smallest warm-up w such that the calls after it begin with a block of at least
MIN_ITERATION_CALLS calls repeated at least twice in full, those repeats covering at
least half of the calls after the warm-up (a trace cut off mid-iteration ends in a
partial block; a few calls after the last iteration are allowed); the block is the
shortest one that does it.

That search ran one failure-function pass per candidate warm-up (64 of them, each over
every call: 30 s of a 300,000-call log). Here:

1. One failure-function pass over the calls *reversed* finds the repeating run that
   reaches the end of the trace, and so its warm-up, however long (the reversed run is
   periodic from its first call: a cut last iteration is a prefix of the block, so its
   reverse is a suffix of the reversed block). One more pass confirms the answer at
   that warm-up with the definition itself.
2. Earlier warm-ups (up to MAX_WARMUP) are still tried first, in order, as before; but a
   warm-up is given its failure-function pass only if the first quarter of what follows
   it recurs within the next half (a necessary condition, checked with NumPy rolling
   hashes in one vectorized step: an equal window always has an equal hash, so no
   answer is missed; equal hashes are then checked exactly by the pass itself). In a
   trace whose warm-up calls never recur, these checks fail at once.
So the answer is the old one wherever the old search found one (the same warm-ups are
tried in the same order with the same test), and where it did not because the warm-up
was longer than MAX_WARMUP, the run found in 1.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

# The fewest calls an iteration is credited with.
MIN_ITERATION_CALLS = 2
# Leading calls tried one by one where no repeating run reaches the end of the trace.
MAX_WARMUP = 64
_HASH_BASE = np.uint64(0x9E3779B97F4A7C15)   # odd: invertible modulo 2**64


def failure(seq: Sequence) -> list[int]:
    """KMP's failure function: fail[i] = length of the longest proper border of seq[:i+1]."""
    fail = [0] * len(seq)
    k = 0
    for i in range(1, len(seq)):
        x = seq[i]
        while k and x != seq[k]:
            k = fail[k - 1]
        if x == seq[k]:
            k += 1
        fail[i] = k
    return fail


def repetition(seq: Sequence) -> tuple[int, int] | None:
    """(period, repeats) of the longest prefix of `seq` made of >= 2 whole repeats of one
    block, where that prefix covers at least half of `seq`."""
    fail = failure(seq)
    for length in range(len(seq), 0, -1):
        if 2 * length < len(seq):
            return None
        p = length - fail[length - 1]
        if length % p == 0 and length // p >= 2:
            return p, length // p
    return None


def find_iterations(codes: Sequence[int]) -> tuple[int, int, int] | None:
    """(repeats, calls per iteration, warm-up calls) of a sequence of call signatures
    (small integers), or None; see the module docstring."""
    seq = list(codes)
    n = len(seq)
    if n < 2 * MIN_ITERATION_CALLS:
        return None
    # The repeating run that reaches the end of the trace: its warm-up may be of any
    # length. Earlier warm-ups are still tried first, as the definition says.
    run = _run_to_the_end(seq)
    last = min(MAX_WARMUP, n // 2)
    if run is not None and run[2] <= last:
        last = run[2] - 1               # the run's own warm-up is confirmed already
    arr = np.asarray(seq, dtype=np.uint64) + np.uint64(1)
    prefix, powers = _hash_tables(arr)
    for skip in range(0, last + 1):
        if not _may_repeat(prefix, powers, skip, n):
            continue
        found = repetition(seq[skip:])
        # A one-call "iteration" says nothing a count of calls does not: not claimed.
        if found and found[0] >= MIN_ITERATION_CALLS:
            return found[1], found[0], skip
    return run


def _run_to_the_end(seq: list[int]) -> tuple[int, int, int] | None:
    """The answer where the repeating part runs to the end of the trace: from one
    failure-function pass over the reversed calls, confirmed by `repetition`."""
    n = len(seq)
    fail = failure(seq[::-1])
    for length in range(n, 2 * MIN_ITERATION_CALLS - 1, -1):
        period = length - fail[length - 1]
        if 2 * period <= length:
            break
    else:
        return None
    if period < MIN_ITERATION_CALLS:
        return None
    skip = n - length
    found = repetition(seq[skip:])
    if found is None or found[0] != period:
        return None
    return found[1], found[0], skip


def _hash_tables(arr: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """prefix[i] = sum of arr[j] * B**j for j < i, and powers[j] = B**j (mod 2**64)."""
    n = len(arr)
    powers = np.empty(n + 1, dtype=np.uint64)
    powers[0] = 1
    with np.errstate(over="ignore"):
        powers[1:] = np.cumprod(np.full(n, _HASH_BASE, dtype=np.uint64))
        prefix = np.zeros(n + 1, dtype=np.uint64)
        np.cumsum(arr * powers[:n], out=prefix[1:])
    return prefix, powers


def _may_repeat(prefix: np.ndarray, powers: np.ndarray, skip: int, n: int) -> bool:
    """Whether calls[skip:] could begin with >= 2 repeats covering half of it: then the
    first quarter recurs at some offset p <= half (the repeats' period)."""
    rest = n - skip
    m = max(1, rest // 4)
    last = rest // 2                              # a period is at most half the repeats' length
    if last < 1 or skip + last + m > n:
        return True                               # too short to tell: let the pass decide
    with np.errstate(over="ignore"):
        head = (prefix[skip + m] - prefix[skip]) * powers[1:last + 1]          # shifted by p
        starts = np.arange(skip + 1, skip + last + 1)
        windows = prefix[starts + m] - prefix[starts]
    return bool(np.any(windows == head))
