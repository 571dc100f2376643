"""Call records as columns: an exact round trip, on every reader's records."""

import pickle

from collc.traces.columns import concat_columns, from_columns, to_columns
from collc.traces.records import CollectiveCall
from collc.traces.sources import read_traces
from trace_samples import TRACES, sample


def test_round_trip_of_every_sample_record():
    ts = read_traces([sample("", TRACES)], workers=1)
    assert len(ts.calls) > 2000
    back = from_columns(pickle.loads(pickle.dumps(to_columns(ts.calls))))
    assert back == ts.calls
    assert [type(c.start_us) for c in back] == [type(c.start_us) for c in ts.calls]


def test_round_trip_of_odd_values():
    # a 64-bit opCount, no rank, members; a number with a leading zero; no number at all
    calls = [CollectiveCall("a", "line 7", "send", rank=None, peer=3, seq=2**64 - 1, group_ranks=(0, 4)),
             CollectiveCall("b.json", "byte offset 0012", "allreduce", rank=0, duration_us=1.5, start_us=0.0),
             CollectiveCall("b.json", "somewhere", "generic", named_by="kernel-name")]
    assert from_columns(to_columns(calls)) == calls
    assert from_columns(to_columns([])) == []


def test_concatenated_columns_are_the_records_one_after_the_other():
    # Tables in another order per part, sparse fields at offsets, a 64-bit opCount in one part only.
    a = [CollectiveCall("a", "line 7", "send", rank=None, peer=3, seq=2**64 - 1, group_ranks=(0, 4)),
         CollectiveCall("a", "somewhere", "allreduce", rank=1, communicator="c1", dtype="float32")]
    b = [CollectiveCall("b.json", "event 3", "allreduce", rank=0, communicator="c2", duration_us=1.5),
         CollectiveCall("b.json", "odd place", "generic", named_by="kernel-name", group_ranks=(1, 2)),
         CollectiveCall("a", "line 9", "send", rank=2, communicator="c1", seq=4)]
    joined = concat_columns([to_columns(a), to_columns([]), to_columns(b)])
    assert joined.n == 5 and from_columns(joined) == a + b


def test_joining_parts_it_may_consume_gives_the_same_records_and_releases_their_arrays():
    a = [CollectiveCall("a", "line 7", "send", rank=None, peer=3, seq=2**64 - 1, group_ranks=(0, 4)),
         CollectiveCall("a", "somewhere", "allreduce", rank=1, communicator="c1", dtype="float32")]
    b = [CollectiveCall("b.json", "event 3", "allreduce", rank=0, communicator="c2", duration_us=1.5),
         CollectiveCall("a", "line 9", "send", rank=2, communicator="c1", seq=4)]
    parts = [to_columns(a), to_columns([]), to_columns(b)]
    joined = concat_columns(parts, consume=True)
    assert from_columns(joined) == a + b
    # the parts' arrays were dropped as they were copied (what keeps a join to one copy)
    assert all(not p.ints and not p.codes and not p.floats for p in parts)


def test_a_joiner_grows_past_its_estimate_and_joins_as_parts_come():
    # Sized for one part like the first (a record), then given 40 records more: grown twice.
    from collc.traces.columns import ColumnsJoiner

    first = [CollectiveCall("a", "line 1", "allreduce", rank=0, communicator="c1", seq=1)]
    more = [[CollectiveCall("b", f"line {k}", "send" if k % 2 else "recv", rank=k, peer=k + 1, seq=2**64 - k,
                            start_us=float(k), group_ranks=(k,) if k == 3 else None) for k in range(m)]
            for m in (4, 36)]
    joiner = ColumnsJoiner(1)
    joiner.add(to_columns(first))
    joiner.add(to_columns(more[0]))
    assert len(joiner.arrays["ints", "seq"]) < 41           # room for the first two and a little
    joiner.add(to_columns(more[1]))
    joined = joiner.result()
    assert joined.n == 41 and from_columns(joined) == first + more[0] + more[1]
    assert from_columns(concat_columns([to_columns(p) for p in (first, *more)])) == first + more[0] + more[1]
    assert from_columns(ColumnsJoiner(3).result()) == []
