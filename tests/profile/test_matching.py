"""Numbering keys by counting gives np.unique's answer."""

from __future__ import annotations

import numpy as np
import pytest

from collc.profile.matching import first_ids, unique_first


@pytest.mark.parametrize("key", [
    np.array([5, 3, 5, 9, 3, 3, -2], dtype=np.int64),                  # dense: counted
    np.random.default_rng(3).integers(-50, 400, 5000).astype(np.int64),
    np.array([7, 1 << 40, 7, -(1 << 50), 1 << 40], dtype=np.int64),   # sparse: sorted
    np.array([2, 1, 2], dtype=np.int32),                               # not int64: sorted
    np.array([4], dtype=np.int64),
])
def test_unique_first_is_np_unique(key):
    want = np.unique(key, return_index=True, return_inverse=True, return_counts=True)
    got = unique_first(key, counts=True)
    assert len(got) == 4
    for w, g in zip(want, got):
        assert g.tolist() == w.reshape(-1).tolist()
    assert [g.tolist() for g in unique_first(key)] == [w.reshape(-1).tolist() for w in want[:3]]


def test_first_ids_number_in_order_of_first_occurrence():
    ids, firsts = first_ids(np.array([9, 4, 9, 0, 4], dtype=np.int64))
    assert ids.tolist() == [0, 1, 0, 2, 1] and firsts.tolist() == [0, 1, 3]
