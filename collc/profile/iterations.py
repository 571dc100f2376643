"""Iterations of a training job as a repeating sequence of calls, found in a few passes.

The definition (unchanged from the per-offset search it replaces): the answer is the
smallest warm-up w such that the calls after it begin with a block of at least
MIN_ITERATION_CALLS calls repeated at least twice in full, those repeats covering at
least half of the calls after the warm-up (a trace cut off mid-iteration ends in a
partial block; a few calls after the last iteration are allowed); the block is the
shortest one that does it.

That search ran one failure-function pass per candidate warm-up (64 of them, each over
every call: 30 s of a 300,000-call log). Here, with the calls as a NumPy array and one
table of rolling hashes over it (an equal window always has an equal hash, so a test by
hashes misses no answer; every equal hash is then checked exactly):

1. The repeating run that reaches the end of the trace, and so its warm-up, however
   long: the longest suffix with a period of at most half its length. A suffix that
   ends in two copies of a block of q calls (a "square", found for every q at once by
   comparing hashes) is followed back, by an exact comparison of the calls q apart,
   to where the period q stops; the longest such suffix is the run, its smallest such q
   the period (a cut last iteration is a prefix of the block, so the run is periodic to
   its end). A q that is a multiple of a shorter period already followed within that
   period's run has the same run, and is not followed again.
2. Earlier warm-ups (up to MAX_WARMUP) are still tried first, in order, as before; a
   warm-up is tested only if a window at its start (of a quarter of the shortest rest)
   recurs within the next half (a necessary condition, one comparison of hashes per
   warm-up); the test itself is the mirror of 1: the longest prefix made of >= 2 whole
   copies of a block, from the prefix squares.
Where more than MOST_MISSES equal hashes turn out not to be equal windows (sequences
made to defeat the hash), the failure-function pass (`repetition`) answers instead.
So the answer is the old one wherever the old search found one (the same warm-ups are
tried in the same order with the same test), and where it did not because the warm-up
was longer than MAX_WARMUP, the run found in 1.
"""

from __future__ import annotations

from typing import Callable, Iterator, Sequence

import numpy as np

# The fewest calls an iteration is credited with.
MIN_ITERATION_CALLS = 2
# Leading calls tried one by one where no repeating run reaches the end of the trace.
MAX_WARMUP = 64
_HASH_BASE = np.uint64(0x9E3779B97F4A7C15)   # odd: invertible modulo 2**64
_HASH_BASE_INVERSE = np.uint64(pow(int(_HASH_BASE), -1, 1 << 64))
# Equal hashes of unequal windows tolerated before the failure-function pass is used.
MOST_MISSES = 32


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
    n = len(codes)
    if n < 2 * MIN_ITERATION_CALLS:
        return None
    arr = np.asarray(codes, dtype=np.int64).astype(np.uint64) + np.uint64(1)
    prefix, powers = _hash_tables(arr)
    # The repeating run that reaches the end of the trace: its warm-up may be of any
    # length. Earlier warm-ups are still tried first, as the definition says.
    run = run_to_the_end(arr, prefix, powers)
    last = min(MAX_WARMUP, n // 2)
    if run is not None and run[2] <= last:
        last = run[2] - 1               # the run's own warm-up is confirmed already
    for skip in _may_repeat(prefix, powers, n, last):
        found = repetition_at(arr, prefix, powers, skip)
        # A one-call "iteration" says nothing a count of calls does not: not claimed.
        if found and found[0] >= MIN_ITERATION_CALLS:
            return found[1], found[0], skip
    return run


def run_to_the_end(arr: np.ndarray, prefix: np.ndarray, powers: np.ndarray) -> tuple[int, int, int] | None:
    """(repeats, period, warm-up) of the longest suffix of `arr` with a period of at
    most half its length (at least 2 * MIN_ITERATION_CALLS calls; a period of at least
    MIN_ITERATION_CALLS), or None: the answer where the repeating part runs to the end
    of the trace (1. of the module docstring). The same as
    `run_to_the_end_by_failure`, which it calls where hashes collide too often."""
    n = len(arr)
    q = np.arange(1, n // 2 + 1)
    with np.errstate(over="ignore"):
        # suffix arr[n-2q:n] is two copies of arr[n-q:n]
        squares = np.flatnonzero((prefix[n - q] - prefix[n - 2 * q]) * powers[q] == prefix[n] - prefix[n - q]) + 1
    backwards = arr[::-1]
    runs = _runs(squares.tolist(), lambda p: p + _common_prefix(backwards[:n - p], backwards[p:]))
    if runs is None:
        return run_to_the_end_by_failure(arr.tolist())
    longest = max((span for _, span in runs), default=0)
    if longest < 2 * MIN_ITERATION_CALLS:
        return None
    period = min(p for p, span in runs if span == longest)   # the run's smallest period
    if period < MIN_ITERATION_CALLS:
        return None
    return longest // period, period, n - longest


def repetition_at(arr: np.ndarray, prefix: np.ndarray, powers: np.ndarray, skip: int) -> tuple[int, int] | None:
    """`repetition(arr[skip:])` from the prefix squares of `arr[skip:]` (2. of the
    module docstring): the same answer, in a few NumPy passes."""
    n = len(arr)
    rest = n - skip
    q = np.arange(1, rest // 2 + 1)
    with np.errstate(over="ignore"):
        # arr[skip:skip+2q] is two copies of arr[skip:skip+q]
        head = prefix[skip + q] - prefix[skip]
        squares = np.flatnonzero(head * powers[q] == prefix[skip + 2 * q] - prefix[skip + q]) + 1
    runs = _runs(squares.tolist(), lambda p: p + _common_prefix(arr[skip:n - p], arr[skip + p:]))
    if runs is None:
        return repetition(arr[skip:].tolist())
    # The longest prefix made of whole copies of a block, and its smallest period.
    longest = max(((span // p) * p for p, span in runs), default=0)
    if longest == 0 or 2 * longest < rest:
        return None
    period = min(p for p, span in runs if span >= longest)
    return period, longest // period


def _runs(squares: list[int], span_of: Callable[[int], int]) -> list[tuple[int, int]] | None:
    """(q, how far period q goes on) of each square of `squares` (candidates by hash,
    increasing) whose run is not a shorter period's: a multiple of period p within p's
    run has p's run (the first call that breaks period p within reach of kp breaks kp
    too), so it is not followed. None after MOST_MISSES candidates that are no square."""
    runs: list[tuple[int, int]] = []
    misses = 0
    for q in squares:
        if any(q % p == 0 and q <= span for p, span in runs):
            continue
        span = span_of(q)
        if span < 2 * q:                  # equal hashes of unequal windows
            misses += 1
            if misses > MOST_MISSES:
                return None
            continue
        runs.append((q, span))
    return runs


def _common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """The length of the common prefix of two arrays of one length, compared in pieces
    that grow fourfold: the cost is that of the prefix, not of the arrays."""
    n, done, step = len(a), 0, 256
    while done < n:
        end = min(n, done + step)
        differ = np.flatnonzero(a[done:end] != b[done:end])
        if differ.size:
            return done + int(differ[0])
        done, step = end, step * 4
    return n


def run_to_the_end_by_failure(seq: list[int]) -> tuple[int, int, int] | None:
    """`run_to_the_end` by one failure-function pass over the calls reversed (the
    reversed run is periodic from its first call), confirmed by `repetition`."""
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


def _may_repeat(prefix: np.ndarray, powers: np.ndarray, n: int, last: int) -> Iterator[int]:
    """The warm-ups 0..last after which the calls could begin with >= 2 repeats covering
    half of them. Such repeats (of period p <= half the rest) make the rest's first
    quarter recur p calls on, and so its first `window` calls (the shortest rest's
    quarter): one hash per window start, made comparable by scaling by B**-start."""
    if last < 0:
        return
    window = (n - last) // 4
    if window < 1:
        yield from range(last + 1)            # too short to tell: let the test decide
        return
    starts = n - window + 1
    with np.errstate(over="ignore"):
        unscale = np.empty(starts, dtype=np.uint64)
        unscale[0] = 1
        unscale[1:] = np.cumprod(np.full(starts - 1, _HASH_BASE_INVERSE, dtype=np.uint64))
        hashes = (prefix[window:] - prefix[:starts]) * unscale
    for skip in range(last + 1):
        half = (n - skip) // 2
        if half < 1 or np.any(hashes[skip + 1:min(skip + half, starts - 1) + 1] == hashes[skip]):
            yield skip
