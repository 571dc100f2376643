"""NCCL debug logs: the real sample, and lines of several NCCL/RCCL versions and launchers.

The version lines follow the COLL format string of NVIDIA/nccl src/enqueue.cc (unchanged
from 2.4 to 2.30 but for `%zi` -> `%zu`), RCCL's ` task <n> globalrank <r>` suffix and
`acc (nil)`, the INIT lines of 2.4 (`comm .. rank .. nranks .. - Init COMPLETE`) and
2.19+ (`ncclCommInitRank... commId 0x..`), and the three TUNING forms (reference section 5).
"""

import gzip
from collections import Counter

import pytest

from collc.diagnostics import CollcError
from collc.traces.sources import read_traces
from trace_samples import LOGS, sample

REAL = "nccl-tests__Timez-zx_all_reduce_perf_2xA100_nccl-2.27.7.log"


def test_real_nccl_tests_log():
    ts = read_traces([sample(REAL, LOGS)])
    # `grep -c "AllReduce: opCount"` = 990; all_reduce_perf sweeps 8 MiB..8 GiB by x2
    # (11 sizes) with 1 warm-up + 20 timed iterations, run twice (in-place and out-of-place)
    # plus 4 more = 45 per size, on each of the two comms (ranks 0 and 1 of one process).
    assert len(ts.calls) == 990
    sizes = [8388608 << k for k in range(11)]
    expected = Counter({(rank, size): 45 for rank in (0, 1) for size in sizes})
    assert Counter((c.rank, c.bytes) for c in ts.calls) == expected
    # INIT lines: both comms share commId 0x54fe282d32a87d85 with nranks 2.
    assert {c.communicator for c in ts.calls} == {"0x54fe282d32a87d85"}
    assert {(c.collective, c.dtype, c.nranks, c.named_by) for c in ts.calls} == {
        ("allreduce", "float32", 2, "log")}
    # Every TUNING line says "Algo RING proto SIMPLE"; 495 of them, none counted as a call.
    assert {(c.algorithm, c.protocol) for c in ts.calls} == {("RING", "SIMPLE")}
    assert ts.world_size == 2
    assert ts.sources[0].to_json() == {"path": str(sample(REAL, LOGS)), "format": "nccl-log",
                                       "records": 990, "skipped": {}}
    # First COLL line is line 523 (`grep -n -m1 "AllReduce: opCount"`): count 2097152 floats.
    first = min(ts.calls, key=lambda c: int(c.location.split()[1]))
    assert (first.location, first.count, first.rank) == ("line 523", 2097152, 0)


V24 = """\
node01:12345:12345 [0] NCCL INFO NCCL version 2.4.8+cuda10.1
node01:12345:12345 [0] NCCL INFO comm 0x55d0c7a0 rank 0 nranks 4 cudaDev 0 nvmlDev 0 - Init COMPLETE
node01:12345:12345 [0] NCCL INFO AllReduce: opCount 0 sendbuff 0x7f3a40000000 recvbuff 0x7f3a40000000 count 1048576 datatype 7 op 0 root 0 comm 0x55d0c7a0 [nranks=4] stream 0x55d0c8b0
node01:12345:12345 [0] NCCL INFO Broadcast: opCount 1 sendbuff 0x7f3a40400000 recvbuff 0x7f3a40400000 count 256 datatype 4 op 0 root 0 comm 0x55d0c7a0 [nranks=4] stream 0x55d0c8b0
node01:12345:12345 [0] NCCL INFO AllGather: opCount 2 sendbuff 0x7f3a40500000 recvbuff 0x7f3a40600000 count 1000 datatype 6 op 0 root 0 comm 0x55d0c7a0 [nranks=4] stream 0x55d0c8b0
node01:12345:12345 [0] NCCL INFO ReduceScatter: opCount 3 sendbuff 0x7f3a40600000 recvbuff 0x7f3a40500000 count 500 datatype 8 op 0 root 0 comm 0x55d0c7a0 [nranks=4] stream 0x55d0c8b0
"""

# torchrun's [rankN]: prefix, NCCL 2.18, point-to-point calls, 2.20-2.22 TUNING without a name.
V218 = """\
[rank1]:node02:2001:2001 [1] NCCL INFO ncclCommInitRank comm 0x5601aa00 rank 1 nranks 8 cudaDev 1 nvmlDev 1 busId 1b000 commId 0x6a3f00c2d1e4b5a7 - Init COMPLETE
[rank1]:node02:2001:2001 [1] NCCL INFO Send: opCount 5 sendbuff 0x7f0010000000 recvbuff (nil) count 4096 datatype 7 op 0 root 3 comm 0x5601aa00 [nranks=8] stream 0x5601bb00
[rank1]:node02:2001:2001 [1] NCCL INFO Recv: opCount 5 sendbuff (nil) recvbuff 0x7f0010004000 count 4096 datatype 7 op 0 root 0 comm 0x5601aa00 [nranks=8] stream 0x5601bb00
[rank1]:node02:2001:2001 [1] NCCL INFO AllReduce: opCount 6 sendbuff 0x7f0020000000 recvbuff 0x7f0020000000 count 2097152 datatype 9 op 0 root 0 comm 0x5601aa00 [nranks=8] stream 0x5601bb00
[rank1]:node02:2001:2001 [1] NCCL INFO 4194304 Bytes -> Algo 1 proto 2 time 61.034000
"""

# Ray workers, NCCL 2.27 with 2.26's timestamps; 2.24+ TUNING; AlltoAll from 2.28.3.
V227 = """\
(RayTrainWorker pid=615, ip=10.72.7.6) [2025-03-04 10:11:12.250000] gpu-node-3:615:1290 [0] NCCL INFO ncclCommInitRankConfig comm 0x7f00e000 rank 5 nranks 16 cudaDev 0 nvmlDev 0 busId 18000 commId 0x1234abcd5678ef00 - Init COMPLETE
(RayTrainWorker pid=615, ip=10.72.7.6) [2025-03-04 10:11:12.500000] gpu-node-3:615:1290 [0] NCCL INFO AllReduce: opCount 1a sendbuff 0x7e0000000000 recvbuff 0x7e0000000000 count 2048 datatype 9 op 0 root 0 comm 0x7f00e000 [nranks=16] stream 0x7f00f000
(RayTrainWorker pid=615, ip=10.72.7.6) [2025-03-04 10:11:12.500010] gpu-node-3:615:1290 [0] NCCL INFO AllReduce: 4096 Bytes -> Algo RING proto LL channel{Lo..Hi}={0..1}
(RayTrainWorker pid=615, ip=10.72.7.6) [2025-03-04 10:11:12.600000] gpu-node-3:615:1290 [0] NCCL INFO AlltoAll: opCount 1b sendbuff 0x7e0000100000 recvbuff 0x7e0000200000 count 128 datatype 7 op 0 root 0 comm 0x7f00e000 [nranks=16] stream 0x7f00f000
"""

# RCCL: `acc (nil)` after recvbuff (newer) and the task/globalrank suffix; mpirun's prefix.
RCCL = """\
[1,2]<stdout>:rocm-node:5555:5555 [2] NCCL INFO AllReduce: opCount 4 sendbuff 0x7fa000000000 recvbuff 0x7fa000000000 acc (nil) count 262144 datatype 7 op 0 root 0 comm 0x5612a0 [nranks=8] stream 0x5613b0 task 0 globalrank 2
[1,2]<stdout>:rocm-node:5555:5555 [2] NCCL INFO AllGather: opCount 5 sendbuff 0x7fa000100000 recvbuff 0x7fa000200000 count 1024 datatype 6 op 0 root 0 comm 0x5612a0 [nranks=8] stream 0x5613b0 task 1 globalrank 2
"""


def _log(tmp_path, text, name="job.log"):
    p = tmp_path / name
    p.write_text(text)
    return p


def _calls(tmp_path, text):
    ts = read_traces([_log(tmp_path, text)])
    return ts, [(c.collective, c.rank, c.nranks, c.dtype, c.count, c.bytes, c.in_bytes,
                 c.out_bytes, c.peer, c.algorithm, c.protocol) for c in ts.calls]


def test_nccl_2_4(tmp_path):
    ts, calls = _calls(tmp_path, V24)
    assert calls == [
        ("allreduce", 0, 4, "float32", 1048576, 4194304, 4194304, 4194304, None, None, None),
        ("broadcast", 0, 4, "int64", 256, 2048, 2048, 2048, None, None, None),
        # AllGather: count is the per-rank send count; nccl-tests' size is the output.
        ("allgather", 0, 4, "float16", 1000, 8000, 2000, 8000, None, None, None),
        # ReduceScatter: count is the per-rank receive count; the size is the input.
        ("reducescatter", 0, 4, "float64", 500, 16000, 16000, 4000, None, None, None)]
    # 2.4's INIT line has no commId: calls are keyed by host:pid:comm, and the user told.
    assert {c.communicator for c in ts.calls} == {"node01:12345:0x55d0c7a0"}
    assert any("no INIT line gives a job-wide commId" in n for n in ts.notes)
    assert [c.location for c in ts.calls] == ["line 3", "line 4", "line 5", "line 6"]


def test_nccl_2_18_torchrun_p2p_and_unnamed_tuning(tmp_path):
    ts, calls = _calls(tmp_path, V218)
    assert calls == [
        ("send", 1, 8, "float32", 4096, 16384, 16384, None, 3, None, None),
        ("recv", 1, 8, "float32", 4096, 16384, None, 16384, 0, None, None),
        ("allreduce", 1, 8, "bfloat16", 2097152, 4194304, 4194304, 4194304, None, "1", "2")]
    assert {c.communicator for c in ts.calls} == {"0x6a3f00c2d1e4b5a7"}
    assert [c.seq for c in ts.calls] == [5, 5, 6]


def test_nccl_2_27_ray_timestamps_alltoall(tmp_path):
    ts, calls = _calls(tmp_path, V227)
    assert calls == [
        ("allreduce", 5, 16, "bfloat16", 2048, 4096, 4096, 4096, None, "RING", "LL"),
        # AlltoAll: count per peer; nccl-tests' size is the whole send buffer.
        ("alltoall", 5, 16, "float32", 128, 8192, 8192, 8192, None, None, None)]
    assert ts.calls[0].seq == 0x1a
    # 2025-03-04 10:11:12.5 UTC in microseconds since the epoch.
    assert ts.calls[0].start_us == 1741083072.5e6
    assert ts.world_size == 16


def test_rccl_task_globalrank_and_mpirun_prefix(tmp_path):
    ts, calls = _calls(tmp_path, RCCL)
    assert calls == [
        ("allreduce", 2, 8, "float32", 262144, 1048576, 1048576, 1048576, None, None, None),
        ("allgather", 2, 8, "float16", 1024, 16384, 2048, 16384, None, None, None)]


def test_interleaved_file_equals_per_rank_files_and_gzip(tmp_path):
    rank0 = V24
    rank1 = V24.replace("12345", "12346").replace("rank 0 nranks", "rank 1 nranks").replace("[0]", "[1]")
    lines = [l for pair in zip(rank0.splitlines(), rank1.splitlines()) for l in pair]
    both = read_traces([_log(tmp_path, "\n".join(lines) + "\n", "all.log")])
    per_rank = tmp_path / "ranks"
    per_rank.mkdir()
    (per_rank / "rank0.log").write_text(rank0)
    with gzip.open(per_rank / "rank1.log.gz", "wt") as f:
        f.write(rank1)
    split = read_traces([per_rank])
    key = lambda c: (c.rank, c.collective, c.bytes)
    assert sorted(map(key, both.calls)) == sorted(map(key, split.calls))
    assert Counter(c.rank for c in split.calls) == {0: 4, 1: 4}
    assert [s.format for s in split.sources] == ["nccl-log", "nccl-log"]


def test_malformed_coll_lines_are_counted_or_fatal(tmp_path):
    garbled = V24.replace("count 256 datatype 4", "count 2x6 datatype 4")
    ts = read_traces([_log(tmp_path, garbled)])
    assert len(ts.calls) == 3
    assert ts.sources[0].skipped == {"COLL line in no known format": 1}
    assert any("(lines 4)" in n for n in ts.notes)
    assert ts.sources[0].skipped_at == {"COLL line in no known format": [4]}
    only_bad = "\n".join(l for l in garbled.splitlines() if "Broadcast" in l or "version" in l) + "\n"
    p = _log(tmp_path, only_bad, "bad.log")
    with pytest.raises(CollcError) as e:
        read_traces([p])
    assert (e.value.span.file, e.value.span.line) == (str(p), 2)


def test_truncated_gzip_log_is_a_located_error(tmp_path):
    raw = gzip.compress(sample(REAL, LOGS).read_bytes())
    p = tmp_path / "cut.log.gz"
    p.write_bytes(raw[: len(raw) * 2 // 3])
    with pytest.raises(CollcError) as e:
        read_traces([p])
    assert e.value.span.file == str(p) and "truncated or corrupt" in e.value.message


# --- records that share a line ---------------------------------------------------------------
# NCCL writes its debug output to stdout ("prone to being mixed up with other application
# output": NVIDIA/nccl#1263), and launchers that collect several ranks' output into one
# stream mangle lines (Slurm `srun -u`: awslabs/awsome-distributed-ai#408; the reader's scan
# already met a line of the 2.27.7 sample's kind with program output glued to its front).
# The quirks below are made from the real 2.27.7 log, as they appear in such logs.

def _quirky_log(tmp_path):
    lines = sample(REAL, LOGS).read_text().split("\n")
    coll = [i for i, line in enumerate(lines) if "opCount" in line]
    out: list[str | None] = list(lines)
    # 1. another thread's prefix glued in front: two prefixes on one line
    out[coll[0]] = "mew0:64904:64921 [1] NCCL INFO " + lines[coll[0]]
    # 2. a record's text continued on the next line, without a prefix
    text = lines[coll[2]]
    cut = text.index(" count ")
    out[coll[2]] = text[:cut] + "\n" + text[cut + 1:]
    # 3. a newline lost: two whole records on one line
    out[coll[5]] = lines[coll[5]] + lines[coll[6]]
    out[coll[6]] = None
    # 4. a record cut short by another's output: the first is lost, the second intact
    text = lines[coll[8]]
    out[coll[8]] = text[:text.index("recvbuff") + 4] + lines[coll[9]]
    out[coll[9]] = None
    p = tmp_path / "merged.log"
    p.write_text("\n".join(line for line in out if line is not None))
    return p, len(coll)


def test_records_sharing_a_line_are_recovered(tmp_path):
    p, total = _quirky_log(tmp_path)
    clean = read_traces([sample(REAL, LOGS)])
    ts = read_traces([p])
    # Every record whose text is intact is read; the one cut short (quirk 4) is counted.
    assert len(ts.calls) == total - 1
    key = lambda c: (c.rank, c.collective, c.bytes, c.communicator, c.seq)
    assert Counter(map(key, clean.calls)) - Counter(map(key, ts.calls)) == Counter([key(clean.calls[8])])
    src = ts.sources[0]
    assert src.skipped == {"COLL line in no known format": 1}
    bad_line = p.read_text().split("\n").index(next(l for l in p.read_text().split("\n")
                                                     if "recvbuffmew0" in l or "recvmew0" in l)) + 1
    assert src.skipped_at == {"COLL line in no known format": [bad_line]}
    assert any(f"(lines {bad_line})" in n for n in ts.notes)
    assert any("1 record(s) cut by a line break" in n for n in ts.notes)
    # Both records of the merged line (quirk 3) carry that line's number.
    merged = p.read_text().split("\n")
    both = [i + 1 for i, l in enumerate(merged) if l.count("opCount") == 2 and "recvbuffmew0" not in l]
    assert len([c for c in ts.calls if c.location == f"line {both[0]}"]) == 2


def test_point_to_point_calls_keep_their_communicators_size(tmp_path):
    # A 4-rank communicator's Send/Recv, in the 2.27 line format: n is 4, the peer apart.
    init = ("node1:7:7 [0] NCCL INFO ncclCommInitRankConfig comm 0x5500 rank 0 nranks 4 cudaDev 0 "
            "nvmlDev 0 busId 17000 commId 0xabc - Init COMPLETE\n")
    send = ("node1:7:7 [0] NCCL INFO Send: opCount 0 sendbuff 0x7200 recvbuff (nil) count 1024 datatype 7 "
            "op 0 root 1 comm 0x5500 [nranks=4] stream 0x55b6\n")
    recv = ("node1:7:7 [0] NCCL INFO Recv: opCount 0 sendbuff (nil) recvbuff 0x7300 count 1024 datatype 7 "
            "op 0 root 3 comm 0x5500 stream 0x55b6\n")
    p = tmp_path / "p2p.log"
    p.write_text(init + send + recv)
    ts = read_traces([p])
    assert [(c.collective, c.nranks, c.peer) for c in ts.calls] == [("send", 4, 1), ("recv", 4, 3)]


@pytest.mark.parametrize("calls", [3, 300])     # replayed one at a time; a column at a time (128+)
@pytest.mark.parametrize("first", [(1 << 63) - 2, (1 << 64) - 2])
def test_opcounts_wider_than_63_bits_are_kept(tmp_path, calls, first):
    # NCCL prints opCount with %lx (64 bits); a 65-bit one is not NCCL's but the pattern
    # takes it: every value comes back exact, as int64 where all fit, else as Python ints.
    line = ("node01:7:7 [0] NCCL INFO AllReduce: opCount {:x} sendbuff 0x7f00 recvbuff 0x7f00 count 8 "
            "datatype 7 op 0 root 0 comm 0x55d0 [nranks=2] stream 0x55e0\n")
    path = tmp_path / "wide.log"
    path.write_text("".join(line.format(first + k) for k in range(calls)))
    ts = read_traces([path])
    assert [c.seq for c in ts.calls] == [first + k for k in range(calls)]
    assert ts.columns.ints["seq"].dtype == (object if first + calls > 1 << 63 else "int64")
