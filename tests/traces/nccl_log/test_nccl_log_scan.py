"""The NCCL log reader's scan: the same records whatever the size of the pieces it reads,
and the same records as the reader gave before it was made faster (digests taken then).

The mixed log below interleaves 40 threads of several processes with NCCL 2.4, 2.18, 2.27
and RCCL lines, timestamps, TUNING lines with and without a COLL line before them,
unknown operations and malformed COLL lines: it drives every path of the scan, including
the flush of pending calls when more than 64 threads wait for a TUNING line.
"""

import dataclasses
import gc
import gzip
import hashlib
import io
import random

import pytest
from hypothesis import given, strategies as st

import collc.traces.nccl_log.sequential as sequential_reader
from collc.diagnostics import CollcError
from collc.traces.nccl_log.reader import read_nccl_log
from collc.traces.sources import read_traces
from trace_samples import LOGS, sample
from test_nccl_log_reader import RCCL, REAL, V24, V218, V227

ODD_LINES = [
    # an operation NCCL does not have, a COLL line with a garbled opCount, an unknown datatype
    "node01:12345:12345 [0] NCCL INFO Frobnicate: opCount 0 sendbuff 0x1 recvbuff 0x1 count 4 "
    "datatype 7 op 0 root 0 comm 0x55d0c7a0 [nranks=4] stream 0x1",
    "node01:12345:12345 [0] NCCL INFO AllReduce: opCount zz sendbuff 0x1 recvbuff 0x1 count 4 "
    "datatype 7 op 0 root 0 comm 0x55d0c7a0",
    "node01:12345:12345 [0] NCCL INFO AllReduce: opCount 3 sendbuff 0x1 recvbuff 0x1 count 4 "
    "datatype 42 op 0 root 0 comm 0x55d0c7a0 stream 0x2",
    "node01:12345:12345 [0] NCCL INFO AllReduce: 4194304 Bytes -> Algo TREE proto LL128 channel{Lo..Hi}={0..3}",
    "node01:12345:12345 [0] NCCL INFO 16 Bytes -> Algo 0 proto 0 time 3.0",
    "node01:12345:12345 [0] NCCL INFO comm 0x55d0c7a0 rank 0 nranks 4 cudaDev 0 busId 1000 - Destroy COMPLETE",
    "2025-01-02T03:04:05 node09:77:78 [3] NCCL INFO AllGather: opCount 7 sendbuff 0x1 recvbuff 0x2 "
    "count 10 datatype 9 op 0 root 0 comm 0xabc [nranks=2] stream 0x3",
    "2025-01-02 03:04:05.123 node09:77:78 [3] NCCL INFO AllGather: 40 Bytes -> Algo RING proto LL",
    "[rank7]:node09:77:79 [3] NCCL INFO ReduceScatter: opCount 8 sendbuff 0x1 recvbuff 0x2 count 10 "
    "datatype 7 op 0 root 0 comm 0xabd stream 0x3",
    "x NCCL INFO comm 0xabd rank 3 nranks 8 commId 0xfeed - Init COMPLETE",
    "noise NCCL INFO AllReduce: opCount",
    "a line of the program's own output",
]


def mixed_log(lines: int, seed: int = 7) -> bytes:
    rng = random.Random(seed)
    templates = [line for text in (V24, V218, V227, RCCL) for line in text.splitlines()]
    templates += ODD_LINES * 4
    out = []
    for _ in range(lines):
        line = rng.choice(templates)
        if rng.random() < 0.5:       # another thread of another process
            line = line.replace(":12345:12345", f":{rng.randrange(12340, 12350)}:{rng.randrange(12340, 12380)}")
        out.append(line)
    return ("\n".join(out) + "\n").encode()


def records(paths) -> list:
    """Everything a read gives, with the files' folder left out (it differs per test run)."""
    ts = read_traces(paths)
    folder = str(paths[0].parent)
    return [[dataclasses.astuple(c)[1:] for c in ts.calls],
            [(s.format, s.records, sorted(s.skipped.items())) for s in ts.sources],
            ts.world_size, sorted((k, dataclasses.astuple(v)) for k, v in ts.communicators.items()),
            [n.replace(folder, "") for n in ts.notes]]


def digest(result: list) -> str:
    return hashlib.sha256(repr(result).encode()).hexdigest()[:16]


@pytest.fixture
def mixed(tmp_path):
    p = tmp_path / "mixed.log"
    p.write_bytes(mixed_log(6000))
    return p


@pytest.fixture
def untuned(tmp_path):
    """One thread's 800 calls and no TUNING line: calls are not held back for one."""
    p = tmp_path / "untuned.log"
    p.write_text(V24 * 200)
    return p


@pytest.mark.parametrize("piece", [64, 1000, 4096])
def test_same_records_whatever_the_piece_size(mixed, untuned, monkeypatch, piece):
    # 64 bytes is shorter than most lines: pieces then end inside a line, and a line is
    # carried over several reads before it is whole.
    whole = records([mixed]), records([untuned])
    monkeypatch.setattr(sequential_reader, "CHUNK_BYTES", piece)
    assert (records([mixed]), records([untuned])) == whole


def test_real_log_same_records_in_small_pieces_and_gzip(tmp_path, monkeypatch):
    real = sample(REAL, LOGS)
    plain = tmp_path / "real.log"
    plain.write_bytes(real.read_bytes())
    packed = tmp_path / "real.log.gz"
    packed.write_bytes(gzip.compress(real.read_bytes()))
    whole = records([plain])
    assert records([packed]) == whole
    monkeypatch.setattr(sequential_reader, "CHUNK_BYTES", 3000)
    assert records([plain]) == whole
    assert records([packed]) == whole


# sha256 (first 16 hex digits) of `records` as the reader gave them before its scan was
# made faster (collc at 880fb4c): the faster scan must give exactly the same records.
# The mixed log's was retaken when the note on unreadable COLL lines began to list their
# line numbers: its records, summaries, world size and communicators were compared equal
# to 880fb4c's first, only the note's text differs.
REAL_DIGEST = "5200dc669c32aca3"
MIXED_DIGEST = "00bcf94f26f7d823"
UNTUNED_DIGEST = "eb7a9355b083afda"


def test_real_log_records_unchanged(tmp_path):
    plain = tmp_path / "real.log"
    plain.write_bytes(sample(REAL, LOGS).read_bytes())
    assert digest(records([plain])) == REAL_DIGEST


def test_mixed_log_records_unchanged(mixed):
    result = records([mixed])
    assert len(result[0]) > 1000 and result[1][0][2]    # calls, and lines skipped for each reason
    assert digest(result) == MIXED_DIGEST


def test_untuned_log_records_unchanged(untuned):
    result = records([untuned])
    assert len(result[0]) == 800 and result[0][-1][0] == "line 1200"
    assert digest(result) == UNTUNED_DIGEST


def test_garbage_collector_left_as_the_caller_had_it(mixed, tmp_path, monkeypatch):
    """The scan pauses the cyclic collector, but never while the caller's code runs."""
    from collc.traces.detect import TraceSource
    from collc.traces.records import SourceSummary, TraceContext
    monkeypatch.setattr(sequential_reader, "CHUNK_BYTES", 4096)      # many batches, many yields
    monkeypatch.setattr(sequential_reader, "PIECES_PER_BATCH", 2)
    source = TraceSource.file(mixed)
    seen = {gc.isenabled() for _ in read_nccl_log(source, SourceSummary(str(mixed), "nccl-log"),
                                                  TraceContext())}
    assert seen == {True} and gc.isenabled()
    cut = tmp_path / "cut.log.gz"
    packed = gzip.compress(mixed.read_bytes())
    cut.write_bytes(packed[: len(packed) // 2])
    with pytest.raises(CollcError):
        read_traces([cut])
    assert gc.isenabled()
    gc.disable()
    try:
        read_traces([mixed])
        assert not gc.isenabled()
    finally:
        gc.enable()


def sparse_log(lines: int, seed: int) -> bytes:
    """COLL lines of every version, an odd line (TUNING, INIT, unknown operation,
    malformed, timestamped, a host name with '-') about every 25th, and now and then two
    records on one line or a record cut by a line break: within a piece the bulk read of
    whole-line records and the read by LINE take turns."""
    rng = random.Random(seed)
    colls = [line for text in (V24, V218, V227, RCCL) for line in text.splitlines() if "opCount" in line]
    out = []
    for _ in range(lines):
        line = rng.choice(colls)
        if rng.random() < 0.5:       # another thread of another process
            line = line.replace(":12345:12345", f":{rng.randrange(12340, 12350)}:{rng.randrange(12340, 12380)}")
        roll = rng.random()
        if roll < 0.04:
            line = rng.choice(ODD_LINES)
        elif roll < 0.05:
            line = line.replace("node01:", "gpu-node-01:")
        elif roll < 0.055:
            line = line + " " + rng.choice(colls)                 # two records, one line
        elif roll < 0.06:
            cut = line.index(" count ")
            line = line[:cut] + "\n   " + line[cut + 1:]          # a record cut by a line break
        out.append(line)
    return ("\n".join(out) + "\n").encode()


def read_state(data: bytes, by_line_pattern: bool) -> tuple:
    """Everything one sequential read of `data` gives: records, skips, notes, world."""
    from collc.traces.columns import from_columns
    from collc.traces.nccl_log.scan import State, finish
    from collc.traces.records import SourceSummary, TraceContext
    state = State("log", SourceSummary("log", "nccl-log"), TraceContext())
    if by_line_pattern:
        state.unclaimed_pieces = 1 << 40       # every piece read by LINE, one match at a time
    sequential_reader.read_stream(io.BytesIO(data), state)
    finish(state)
    calls = [dataclasses.astuple(c) for c in from_columns(state.collected.columns("log"))]
    return (calls, state.summary.records, sorted(state.summary.skipped.items()), state.context.notes,
            state.context.world_size, sorted(state.context.communicators.items()))


@pytest.mark.parametrize("piece", [700, 1 << 20])
def test_bulk_read_same_as_line_pattern(monkeypatch, piece):
    data = sparse_log(1500, seed=11)
    monkeypatch.setattr(sequential_reader, "CHUNK_BYTES", piece)
    bulk = read_state(data, by_line_pattern=False)
    assert len(bulk[0]) > 1200 and len(bulk[2]) >= 3         # records, and skips of several kinds
    assert bulk == read_state(data, by_line_pattern=True)


def test_untuned_replay_same_as_one_event_at_a_time(monkeypatch):
    """Calls without TUNING lines, of few threads (held back in blocks of 513) and then of
    more than 64 (all emitted at once): the columnar replay and the one-event-at-a-time
    replay emit the same records in the same order."""
    import collc.traces.nccl_log.scan as scan_module
    rng = random.Random(5)
    template = next(line for line in V24.splitlines() if "opCount" in line)
    assert ":12345:12345" in template
    few = [template.replace(":12345:12345", f":{rng.randrange(2)}:1") for _ in range(1500)]
    many = [template.replace(":12345:12345", f":{rng.randrange(40)}:{rng.randrange(3)}") for _ in range(600)]
    data = ("\n".join(few + many) + "\n").encode()
    monkeypatch.setattr(sequential_reader, "CHUNK_BYTES", 40_000)    # 200 calls a piece: replayed as columns
    columnar = read_state(data, by_line_pattern=False)
    monkeypatch.setattr(scan_module, "replay_untuned", lambda *args: False)
    assert columnar == read_state(data, by_line_pattern=False)


def tuned_log(calls: int, seed: int) -> bytes:
    """What NCCL_DEBUG_SUBSYS=COLL,TUNING writes: a TUNING line after every COLL line, of
    the same thread; now and then one of another size or operation (the call stays
    untuned), a call with none, a TUNING line with no call, a timestamped pair, a
    thread that interleaves, or an INIT line."""
    rng = random.Random(seed)
    colls = [line for text in (V24, V218, V227) for line in text.splitlines() if "opCount" in line]
    out = []
    for _ in range(calls):
        line = rng.choice(colls)
        prefix, _, rest = line.partition("NCCL INFO ")
        if rng.random() < 0.3:
            prefix = prefix.replace(":12345:12345", f":{rng.randrange(12340, 12344)}:{rng.randrange(12340, 12344)}")
        op = rest.split(":")[0]
        count = int(rest.split(" count ")[1].split()[0])
        nbytes = count * 4 if rng.random() < 0.9 else count * 2
        tuned_op = op if rng.random() < 0.95 else "Broadcast"
        tuning = f"{tuned_op}: {nbytes} Bytes -> Algo RING proto LL128 channel{{Lo..Hi}}={{0..3}}"
        roll = rng.random()
        if roll < 0.003 or 0.995 < roll:
            prefix = "2025-01-02 03:04:05.123 " + prefix
        out.append(prefix + "NCCL INFO " + rest)
        if roll < 0.005:
            continue                                                  # a call with no TUNING line
        if roll < 0.01:
            out.append(rng.choice(ODD_LINES))
        out.append(prefix + "NCCL INFO " + tuning)
    return ("\n".join(out) + "\n").encode()


@pytest.mark.parametrize("piece", [40_000, 1 << 20])
def test_tuned_log_in_bulk_same_as_line_pattern(monkeypatch, piece):
    import collc.traces.nccl_log.scan as scan_module
    data = tuned_log(2000, seed=3)
    monkeypatch.setattr(sequential_reader, "CHUNK_BYTES", piece)
    paired = []
    real_paired = scan_module.replay_paired
    monkeypatch.setattr(scan_module, "replay_paired",
                        lambda *args: paired.append(args[2] - args[1]) or real_paired(*args))
    bulk = read_state(data, by_line_pattern=False)
    assert sum(paired) > 2000                                # most events replayed as pairs
    assert "LL128" in repr(bulk[0]) and "None, None" in repr(bulk[0])     # calls tuned, and some not
    assert bulk == read_state(data, by_line_pattern=True)
    monkeypatch.setattr(scan_module, "replay_paired", lambda *args: False)
    assert bulk == read_state(data, by_line_pattern=False)   # the pairs one event at a time


FRAGMENTS = ["\n", "\r\n", "NCCL INFO ", "AllReduce: opCount 1 sendbuff 0x1 recvbuff 0x1 ",
             "count 4 datatype 7 op 0 root 0 comm 0x5 [nranks=2] stream 0x1", " task 3 globalrank 1",
             "16 Bytes -> Algo RING proto LL", "comm 0x5 rank 0 nranks 2 ", "node01:1:1 [0] ", "N", "x", " "]


@given(st.lists(st.sampled_from(FRAGMENTS), min_size=1, max_size=40), st.integers(0, 5))
def test_bulk_rows_count_the_pieces_line_breaks(parts, skip):
    # The scan counts a piece's lines from WHOLE_LINE's rows (one per line, and an empty
    # match at the end) instead of counting its newlines again: the same number, for any
    # text and wherever the piece starts.
    from collc.traces.nccl_log.scan import WHOLE_LINE
    data = ("x" * skip + "".join(parts)).encode()
    rows = WHOLE_LINE.findall(data, skip)
    assert len(rows) - (1 if data[-1:] == b"\n" else 2) == data.count(b"\n", skip)
