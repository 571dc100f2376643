"""Numbering keys by counting gives np.unique's answer; packed keys are equal exactly where their columns are."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from collc.profile.matching import dense_key, first_ids, unique_first


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


def _columns(draw_ints, n: int, dtypes: list[str]) -> list[np.ndarray]:
    out = []
    for k, dtype in enumerate(dtypes):
        values = draw_ints[k * n:(k + 1) * n]
        if dtype == "bool":
            out.append(np.array([v % 2 == 1 for v in values], dtype=bool))
        elif dtype == "object":                       # Python ints in an object array
            out.append(np.array(values, dtype=object))
        else:
            info = np.iinfo(dtype)
            out.append(np.array([min(max(v, info.min), info.max) for v in values], dtype=dtype))
    return out


@given(st.integers(1, 40), st.lists(st.sampled_from(["bool", "int32", "int64", "uint32", "uint8", "object"]),
                                    min_size=1, max_size=6), st.data())
def test_dense_key_equal_exactly_where_every_column_is(n, dtypes, data):
    # Wide values force the renumbering where the packed key would pass 62 bits.
    ints = data.draw(st.lists(st.integers(-(1 << 40), 1 << 40) | st.integers(-3, 3),
                              min_size=n * len(dtypes), max_size=n * len(dtypes)))
    columns = _columns(ints, n, dtypes)
    kept = [c.copy() for c in columns]
    key = dense_key(iter(columns), n)
    assert key.dtype == np.int64 and len(key) == n
    rows = list(zip(*(c.tolist() for c in columns)))
    for i in range(n):
        for j in range(n):
            assert (key[i] == key[j]) == (rows[i] == rows[j])
    for c, k in zip(columns, kept):                   # the caller's columns are left as they were
        assert c.dtype == k.dtype and c.tolist() == k.tolist()


@given(st.lists(st.integers(-2**62, 2**62), min_size=0, max_size=60), st.integers(0, 3))
def test_dense_codes_of_call_sizes_are_np_uniques_inverse(values, repeat):
    # Few distinct values among many are searched in a table of them (a sample's, and
    # what it missed); any values at all give np.unique's inverse.
    from collc.profile.matching import _int_codes
    v = np.array(values * (1 + 200 * repeat), dtype=np.int64)
    assert np.array_equal(_int_codes(v, dense=True), np.unique(v, return_inverse=True)[1].reshape(-1))


@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 6)), min_size=0, max_size=80), st.booleans())
def test_repeated_seqs_only_where_a_stream_has_a_seq_twice(records, timed):
    # Streams whose seqs rise are passed over; the others are checked exactly.
    from collc.profile.matching import _repeated_seqs, _stream_order
    if not records:
        return
    stream = np.array([s for s, _ in records], dtype=np.int64)
    seq = np.array([q for _, q in records], dtype=np.int64)
    start = np.arange(len(records), 0, -1, dtype=np.float64)          # issue order: the reverse of reading
    _, order, ordered = _stream_order(stream, start, np.full(len(records), not timed))
    want = np.zeros(int(stream.max()) + 1, dtype=bool)
    for s in set(stream.tolist()):
        seqs = seq[stream == s].tolist()
        want[s] = len(seqs) != len(set(seqs))
    assert np.array_equal(_repeated_seqs(stream, seq, order, ordered), want)
