"""The iteration search against its definition, searched the slow way."""

from __future__ import annotations

import random

import numpy as np
import pytest

from collc.profile import iterations
from collc.profile.iterations import (MAX_WARMUP, MIN_ITERATION_CALLS, find_iterations, repetition,
                                      run_to_the_end_by_failure)


def by_definition(seq: list[int]) -> tuple[int, int, int] | None:
    """The search the module replaced: each warm-up up to MAX_WARMUP in order, one
    failure-function pass each; then the run that reaches the end of the trace."""
    n = len(seq)
    if n < 2 * MIN_ITERATION_CALLS:
        return None
    for skip in range(0, min(MAX_WARMUP, n // 2) + 1):
        found = repetition(seq[skip:])
        if found and found[0] >= MIN_ITERATION_CALLS:
            return found[1], found[0], skip
    return run_to_the_end_by_failure(seq)


def _trace(rng: random.Random) -> list[int]:
    """A warm-up, whole iterations, a cut one and a few stray calls, from few signatures
    (so that short squares and near-repeats are common)."""
    alphabet = rng.choice((2, 3, 5))
    block = [rng.randrange(alphabet) for _ in range(rng.randint(1, 12))]
    warmup = [rng.randrange(alphabet) for _ in range(rng.choice((0, 1, 3, 40, 70, 150)))]
    body = block * rng.randint(1, 12) + block[:rng.randrange(len(block) + 1)]
    tail = [rng.randrange(alphabet) for _ in range(rng.choice((0, 0, 1, 2)))]
    seq = warmup + body + tail
    if rng.random() < 0.3 and seq:                  # one call changed somewhere
        seq[rng.randrange(len(seq))] = rng.randrange(alphabet)
    return seq


def test_the_same_answer_as_the_definition_on_random_traces():
    rng = random.Random(7)
    for _ in range(400):
        seq = _trace(rng)
        assert find_iterations(seq) == by_definition(seq), seq


def test_a_long_warmup_and_a_cut_last_iteration():
    block = [4, 5, 6, 7, 5]
    seq = list(range(100, 300)) + block * 50 + block[:3]
    assert find_iterations(seq) == (50, 5, 200) == by_definition(seq)
    assert find_iterations(np.asarray(seq)) == (50, 5, 200)      # a NumPy column as well


def test_sequences_that_defeat_the_hash_get_the_failure_function_answer(monkeypatch):
    # Thue-Morse words collide under any odd base modulo 2**64 (the hash's weakness);
    # with no miss tolerated, every collision sends the search to the exact passes.
    morse = [bin(i).count("1") % 2 for i in range(4096)]
    monkeypatch.setattr(iterations, "MOST_MISSES", 0)
    for seq in (morse, morse * 3, morse[:2048] + [1 - x for x in morse[:2048]]):
        assert find_iterations(seq) == by_definition(seq)


@pytest.mark.parametrize("seq", [[], [1], [1, 1, 1], [1, 1, 1, 1], [1, 2, 1, 2], [1, 2, 3, 1, 2, 3, 1]])
def test_short_sequences(seq):
    assert find_iterations(seq) == by_definition(seq)
