"""The mix's arithmetic on constructed call records: matching, stragglers, bandwidths,
iterations and roles."""

import pytest

from collc.profile.mix import build_mix, bus_factor, guess_role, match_calls
from collc.traces.records import CollectiveCall
from collections import Counter


def call(rank, coll="allreduce", comm="pg0", nbytes=1 << 20, dur=None, seq=None, start=None, nranks=4, **kw):
    return CollectiveCall(f"rank{rank}.json", "event 1", coll, rank=rank, communicator=comm, nranks=nranks,
                          dtype="float32", bytes=nbytes, duration_us=dur, seq=seq, start_us=start, **kw)


def test_latency_is_shortest_duration_and_straggler_the_spread():
    calls = [call(r, dur=100.0 + 10 * r) for r in range(4)]
    mix = build_mix(calls)
    (row,) = mix.rows
    assert (row.calls, row.job_calls, len(row.ranks)) == (4, 1, 4)
    assert row.time_us == 100.0
    assert row.straggler_us == 30.0


def test_busbw_uses_nccl_tests_factors():
    # 1 MiB AllReduce on 4 ranks in 100 us: algbw = 1048576 / 100e-6 / 1e9; busbw x 2*3/4.
    mix = build_mix([call(r, dur=100.0) for r in range(4)])
    (row,) = mix.rows
    assert row.algbw_GBps == pytest.approx(10.48576)
    assert row.busbw_GBps == pytest.approx(10.48576 * 1.5)
    assert bus_factor("allgather", 8) == pytest.approx(7 / 8)
    assert bus_factor("broadcast", 8) == 1.0
    assert bus_factor("send", 2) == 1.0


def test_calls_match_by_order_per_communicator():
    # Rank 1's records are listed in another order, but their start times give the issue order.
    calls = [call(0, nbytes=1024, dur=5.0, start=0.0), call(0, nbytes=4096, dur=9.0, start=10.0),
             call(1, nbytes=4096, dur=7.0, start=11.0), call(1, nbytes=1024, dur=8.0, start=1.0)]
    mix = build_mix(calls)
    by_size = {r.bytes: r for r in mix.rows}
    assert by_size[1024].time_us == 5.0 and by_size[1024].straggler_us == 3.0
    assert by_size[4096].time_us == 7.0 and by_size[4096].straggler_us == 2.0
    assert all(r.job_calls == 1 and r.calls == 2 for r in mix.rows)


def test_seq_matches_when_unique_and_is_ignored_when_repeated():
    # Unique Seq: rank 1 lost its first call, yet seq 2 still meets seq 2.
    calls = [call(0, seq=1, dur=1.0), call(0, seq=2, dur=2.0), call(1, seq=2, dur=4.0)]
    jobs = match_calls(calls)
    assert sorted(len(j.records) for j in jobs) == [1, 2]
    # NCCL's opCount repeats inside a group: order decides instead.
    calls = [call(0, seq=0, dur=1.0), call(0, seq=0, dur=2.0), call(1, seq=0, dur=3.0), call(1, seq=0, dur=4.0)]
    jobs = match_calls(calls)
    assert sorted(j.latency_us for j in jobs) == [1.0, 2.0]


def test_records_disagreeing_on_size_are_not_merged():
    jobs = match_calls([call(0, nbytes=1024), call(1, nbytes=2048)])
    assert len(jobs) == 2


def test_send_recv_pair_is_one_transfer_on_the_send_row():
    calls = [call(0, "send", comm="pp", peer=1, dur=5.0, nranks=None),
             call(1, "recv", comm="pp", peer=0, dur=8.0, nranks=None),
             call(2, "recv", comm="pp", peer=3, dur=2.0, nranks=None)]  # its send was not traced
    mix = build_mix(calls)
    rows = {r.collective: r for r in mix.rows}
    assert rows["send"].calls == 2 and rows["send"].job_calls == 1
    assert rows["send"].time_us == 5.0 and rows["send"].straggler_us == 3.0
    # n is the communicator's size (unknown here), not 2: the other end is `peers`.
    assert rows["recv"].calls == 1 and rows["recv"].nranks is None
    assert rows["recv"].to_json()["peers"] == [3] and rows["send"].to_json()["peers"] == [0, 1]


def test_untimed_trace_is_weighted_by_bytes():
    mix = build_mix([call(r, nbytes=1 << 20) for r in range(2)] + [call(r, "allgather", nbytes=1 << 10)
                                                                    for r in range(2)])
    assert not mix.timed
    assert mix.rows[0].time_us is None
    assert [r.collective for r in mix.sorted_rows()] == ["allreduce", "allgather"]
    assert mix.to_json()["weighted_by"] == "bytes"


def test_iterations_from_a_repeating_sequence_with_warmup_and_a_cut_tail():
    calls = [call(0, "broadcast", nbytes=8, start=0.0)]  # setup
    t = 1.0
    for _ in range(4):
        for coll, size in (("allgather", 4096), ("reducescatter", 4096), ("allreduce", 64)):
            calls.append(call(0, coll, nbytes=size, start=t))
            t += 1
    calls.append(call(0, "allgather", nbytes=4096, start=t))  # the trace stops mid-iteration
    it = build_mix(calls).iterations
    assert (it.count, it.calls_per_iteration, it.warmup_calls) == (4, 3, 1)


def test_no_iterations_in_a_sweep():
    calls = [call(0, nbytes=1 << k, start=float(k)) for k in range(10)]
    assert build_mix(calls).iterations is None
    assert any("no iterations" in n for n in build_mix(calls).notes)


def test_role_guesses():
    dense = Counter(allreduce=10)
    assert guess_role(8, tuple(range(8)), dense, 8)[0] == "data-parallel"
    assert guess_role(4, (4, 5, 6, 7), dense, 16)[0] == "tensor-parallel"
    assert guess_role(4, (1, 5, 9, 13), dense, 16)[0] == "data-parallel"
    assert guess_role(2, (0, 4), Counter(send=5, recv=5), 8)[0] == "pipeline-parallel"
    assert guess_role(8, None, Counter(alltoall=9, allreduce=1), 8)[0] == "expert-parallel"
    assert guess_role(4, None, dense, 16)[0] == "unknown"


def test_world_size_and_members_from_group_ranks():
    calls = [call(r, comm="tp1", nranks=2, group_ranks=(2, 3)) for r in (2, 3)]
    mix = build_mix(calls, world_size=4)
    comm = mix.communicators["tp1"]
    assert comm.ranks == (2, 3) and comm.role == "tensor-parallel"
    assert build_mix(calls).world_size == 4  # highest rank seen + 1


# --- every NCCL kernel of a trace is in the table -----------------------------------------

import gzip as _gzip
import json as _json

from collc.traces.sources import read_traces
from trace_samples import TRACES


def _kernels_of(path):
    """The trace's NCCL kernels (count, total duration), read with `json`, not collc."""
    with _gzip.open(path, "rt") as f:
        events = _json.load(f)["traceEvents"]
    durs = [e["dur"] for e in events if e.get("ph") == "X" and isinstance(e.get("name"), str)
            and e["name"].startswith(("ncclKernel", "ncclDevKernel"))]
    return len(durs), sum(durs)


SAMPLE_FILES = sorted(p.name for p in TRACES.glob("*") if not p.name.startswith("MANIFEST")) if TRACES.exists() else []


@pytest.mark.parametrize("name", SAMPLE_FILES)
def test_table_calls_and_time_add_up_to_the_traces_records(name):
    """Sum of the table's calls (and kernel time) = the trace's NCCL kernels, on every sample."""
    path = TRACES / name
    ts = read_traces([path])
    if not ts.calls:
        pytest.skip(f"{name}: no call records")
    mix = build_mix(ts.calls, ts.world_size, ts.communicators, ts.notes)
    calls = sum(r.calls for r in mix.rows)
    assert calls == len(ts.calls) == sum(s.records for s in ts.sources)
    if name.startswith("hta__"):            # Kineto: the kernels are the ground truth
        kernels, kernel_us = _kernels_of(path)
        assert calls == kernels
        assert sum(r.time_us or 0.0 for r in mix.rows) == pytest.approx(kernel_us, rel=1e-9)
        assert sum(s.skipped.total() for s in ts.sources) == 0


def test_point_to_point_rows_have_the_communicators_size_and_their_peers():
    # A Send/Recv on a communicator of 4 ranks (NCCL logs `[nranks=4]` on its COLL line).
    calls = [call(0, "send", nbytes=64, nranks=4, peer=1), call(1, "recv", nbytes=64, nranks=4, peer=0),
             call(0, "send", nbytes=64, nranks=4, peer=3)]
    mix = build_mix(calls)
    rows = {(r.collective, r.bytes): r for r in mix.rows}
    send = rows[("send", 64)]
    assert send.nranks == 4 and send.calls == 3 and send.job_calls == 2
    assert send.to_json()["peers"] == [0, 1, 3]
    # Without a size on the records, the communicator's (its INIT line's) is taken.
    from collc.traces.records import CommunicatorInfo
    bare = [call(0, "send", nbytes=64, nranks=None, peer=1)]
    mix = build_mix(bare, 4, {"pg0": CommunicatorInfo("pg0", 4)})
    assert mix.rows[0].nranks == 4 and mix.rows[0].to_json()["peers"] == [1]
