"""A big NCCL log read by several processes gives exactly what one process gives.

The split is forced onto small logs (pieces of a few kB, several per process) so that
every piece boundary case occurs: INIT lines in one piece and the COLL lines they name
in later ones, calls whose TUNING line is in the next piece, threads with no TUNING
line (calls flushed every 513), more than 64 threads waiting at once, comms no INIT
line names first seen in several pieces, malformed lines, lines longer than a piece,
no newline at the end, gzip (decompressed here, pieces sent), and errors.
"""

import gzip
import random
import threading

import pytest

import collc.traces.nccl_log.parallel as split
import collc.traces.nccl_log.sequential as sequential_reader
from collc.diagnostics import CollcError
from collc.traces.detect import TraceSource
from collc.traces.nccl_log.scan import State
from collc.traces.records import SourceSummary
from collc.traces.sources import read_traces
from trace_samples import LOGS, sample
from test_nccl_log_reader import REAL, V24
from test_nccl_log_scan import mixed_log, records


@pytest.fixture(autouse=True)
def no_other_threads():
    # The reader never forks while other threads run (see test_no_fork_while_threads_run).
    if threading.active_count() > 1:
        pytest.skip("another thread runs in this test process: the reader would not fork")


def read_both(paths, monkeypatch, piece: int = 3000) -> tuple[list, list, int]:
    """(records read by one process, records read by two in pieces of `piece` bytes,
    the number of pieces the second read replayed)."""
    monkeypatch.setenv(split.PROCESSES_ENV, "1")
    sequential = records(paths)
    monkeypatch.setenv(split.PROCESSES_ENV, "2")
    monkeypatch.setattr(split, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setattr(split, "PIECE_BYTES", piece)
    monkeypatch.setattr(sequential_reader, "CHUNK_BYTES", max(64, piece // 3))
    merged = []
    merge = split._merge
    monkeypatch.setattr(split, "_merge", lambda *a: merged.append(1) or merge(*a))
    return sequential, records(paths), len(merged)


def _gzip(path):
    packed = path.with_name(path.name + ".gz")
    packed.write_bytes(gzip.compress(path.read_bytes()))
    return packed


@pytest.mark.parametrize("seed,piece", [(7, 3000), (11, 777), (12, 20_000)])
def test_mixed_log_same_records(tmp_path, monkeypatch, seed, piece):
    # 40 threads of several processes, four NCCL/RCCL versions, TUNING lines with and
    # without a call before them, unknown operations, malformed COLL lines, INIT lines.
    p = tmp_path / "mixed.log"
    p.write_bytes(mixed_log(6000, seed))
    sequential, parallel, pieces = read_both([p], monkeypatch, piece)
    assert pieces > 10 and len(sequential[0]) > 1000 and sequential[1][0][2]
    assert parallel == sequential
    sequential, parallel, pieces = read_both([_gzip(p)], monkeypatch, piece)
    assert pieces > 10 and parallel == sequential


def test_real_log_copies_same_records(tmp_path, monkeypatch):
    # INIT lines name the comms once per copy; every call's TUNING line follows it, so a
    # piece boundary often falls between a call and the TUNING line that completes it.
    p = tmp_path / "real.log"
    p.write_bytes(sample(REAL, LOGS).read_bytes() * 3)
    sequential, parallel, pieces = read_both([p], monkeypatch, 5000)
    assert pieces > 100 and len(sequential[0]) == 2970
    assert {c[12] for c in sequential[0]} == {"RING"}      # every call got its TUNING line
    assert parallel == sequential


def test_comm_named_by_an_init_line_pieces_before(tmp_path, monkeypatch):
    # 2.4-style lines: INIT lines without commId, a second rank's INIT line far from its
    # calls, COLL lines that need the INIT line for their rank, and no TUNING line at all:
    # one thread's calls are flushed every 513, the other's at the end.
    init0 = V24.splitlines()[1]
    init1 = init0.replace("12345", "12346").replace("rank 0 nranks 4", "rank 2 nranks 4")
    coll = V24.splitlines()[2].replace(" [nranks=4]", "")
    filler = "node01:12345:12399 [0] NCCL INFO Channel 00/02 : 0 1 2 3\n"
    text = "\n".join([init0, init1]) + "\n" + filler * 300 + "".join(
        (coll if k % 3 else coll.replace("12345", "12346")) + "\n" + filler * (k % 4)
        for k in range(1500))
    p = tmp_path / "old.log"
    p.write_text(text.rstrip("\n"))          # and no newline at the end
    sequential, parallel, pieces = read_both([p], monkeypatch, 4000)
    assert pieces > 20 and parallel == sequential
    assert {(c[2], c[3], c[4]) for c in sequential[0]} == {
        (0, "node01:12345:0x55d0c7a0", 4), (2, "node01:12346:0x55d0c7a0", 4)}


def test_lines_longer_than_a_piece(tmp_path, monkeypatch):
    long_line = "x" * 9000 + " NCCL INFO " + "y" * 9000
    p = tmp_path / "long.log"
    p.write_bytes(mixed_log(400, 3) + (long_line + "\n").encode() * 3 + mixed_log(400, 4))
    sequential, parallel, pieces = read_both([p], monkeypatch, 2000)
    assert parallel == sequential
    # gzip: pieces go through shared memory, or pickled when too big for a slot
    kinds = []
    task = split._Slots.task

    def spy(self, *args):
        made = task(self, *args)
        kinds.append(made.scan)
        return made

    monkeypatch.setattr(split._Slots, "task", spy)
    sequential, parallel, pieces = read_both([_gzip(p)], monkeypatch, 2000)
    assert parallel == sequential
    if "fork" in split.multiprocessing.get_all_start_methods():
        assert set(kinds) == {split._scan_shared, split._scan_bytes}


@pytest.mark.parametrize("first_read", [0, 10**9])
def test_errors_located_as_in_one_process(tmp_path, monkeypatch, first_read):
    good = mixed_log(3000, 5)
    bad_only = b"".join(line + b"\n" for line in good.splitlines() if b"opCount zz" in line)
    p = tmp_path / "bad.log"
    p.write_bytes(b"a line of the program's own output\n" * 2000 + bad_only)
    cut = tmp_path / "cut.log.gz"
    packed = gzip.compress(good * 4)
    cut.write_bytes(packed[: len(packed) * 2 // 3])
    for path in (p, cut):
        errors = []
        for processes in ("1", "2"):
            monkeypatch.setenv(split.PROCESSES_ENV, processes)
            monkeypatch.setattr(split, "PARALLEL_MIN_BYTES", first_read)
            monkeypatch.setattr(split, "PIECE_BYTES", 4096)
            monkeypatch.setattr(sequential_reader, "CHUNK_BYTES", 1024)
            with pytest.raises(CollcError) as e:
                read_traces([path])
            errors.append((e.value.message, e.value.span, e.value.notes))
        assert errors[0] == errors[1]
    assert errors[0][1].line > 1000


def test_small_or_single_cpu_reads_stay_in_process(tmp_path, monkeypatch):
    p = tmp_path / "small.log"
    p.write_bytes(mixed_log(500))
    state = State(str(p), SourceSummary(str(p), "nccl-log"), None)
    monkeypatch.setenv(split.PROCESSES_ENV, "2")
    assert split.read_split(TraceSource.file(p), state) is None          # < PARALLEL_MIN_BYTES
    monkeypatch.setattr(split, "PARALLEL_MIN_BYTES", 0)
    reader = split.read_split(TraceSource.file(p), state)
    assert reader is not None
    reader.close()
    monkeypatch.setenv(split.PROCESSES_ENV, "1")
    assert split.read_split(TraceSource.file(p), state) is None
    monkeypatch.setenv(split.PROCESSES_ENV, "none")        # not a count: the usable CPUs
    assert split.processes() >= 1


def test_no_fork_while_threads_run(tmp_path, monkeypatch):
    # A child forked from a process with other threads can deadlock (a lock held by one
    # of them): such a process reads in one process, with the same result.
    p = tmp_path / "mixed.log"
    p.write_bytes(mixed_log(2000))
    sequential = records([p])
    monkeypatch.setenv(split.PROCESSES_ENV, "2")
    monkeypatch.setattr(split, "PARALLEL_MIN_BYTES", 0)
    state = State(str(p), SourceSummary(str(p), "nccl-log"), None)
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    try:
        if "fork" in split.multiprocessing.get_all_start_methods():
            assert split.read_split(TraceSource.file(p), state) is None
        assert records([p]) == sequential
    finally:
        stop.set()
        thread.join()


def test_random_interleavings(tmp_path, monkeypatch):
    # Lines of the real log and of the constructed versions shuffled together, cut at
    # random piece sizes.
    real = sample(REAL, LOGS).read_bytes().splitlines()
    rng = random.Random(1)
    for k in range(3):
        lines = real + mixed_log(2000, 20 + k).splitlines()
        rng.shuffle(lines)
        p = tmp_path / f"shuffled{k}.log"
        p.write_bytes(b"\n".join(lines) + b"\n")
        sequential, parallel, pieces = read_both([p], monkeypatch, rng.randrange(500, 6000))
        assert pieces > 5 and parallel == sequential


@pytest.mark.parametrize("first_read", [20_000, 10**9])
def test_gzip_first_read_cut_into_pieces(tmp_path, monkeypatch, first_read):
    # The stream's first read (PARALLEL_MIN_BYTES) spans several pieces, or all of a
    # small log (then read in this process).
    p = tmp_path / "mixed.log"
    p.write_bytes(mixed_log(1500, 8))
    packed = _gzip(p)
    monkeypatch.setenv(split.PROCESSES_ENV, "1")
    sequential = records([packed])
    monkeypatch.setenv(split.PROCESSES_ENV, "2")
    monkeypatch.setattr(split, "PARALLEL_MIN_BYTES", first_read)
    monkeypatch.setattr(split, "PIECE_BYTES", 3000)
    merged = []
    merge = split._merge
    monkeypatch.setattr(split, "_merge", lambda *a: merged.append(1) or merge(*a))
    assert records([packed]) == sequential
    assert len(merged) > 20 if first_read < len(p.read_bytes()) else not merged


def test_log_in_a_tar_archive(tmp_path, monkeypatch):
    # An archive member is a stream (read here, pieces sent), never the archive's file.
    import tarfile
    p = tmp_path / "rank0.log"
    p.write_bytes(mixed_log(3000, 6))
    archive = tmp_path / "logs.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add(p, arcname="job/rank0.log")
    sequential, parallel, pieces = read_both([archive], monkeypatch, 4000)
    assert pieces > 20 and len(sequential[0]) > 500 and parallel == sequential


def _spy_reads(monkeypatch) -> tuple[list, list]:
    """(offsets of pieces read whole in this process, pieces scanned again here)."""
    reads, rescans = [], []
    piece_at, valid = split._piece_at, split._Speculation.valid
    monkeypatch.setattr(split, "_piece_at", lambda fd, start, size: reads.append(start) or piece_at(fd, start, size))
    monkeypatch.setattr(split._Speculation, "valid",
                        lambda self, piece: valid(self, piece) or rescans.append(piece.args[2]) or False)
    return reads, rescans


@pytest.mark.parametrize("where", ["top", "middle"])
def test_pieces_handed_out_unread_with_the_first_pieces_init_tables(tmp_path, monkeypatch, where):
    # INIT lines at the top (the usual log): only the first piece is read here, the rest
    # handed out with its tables. INIT lines of new comms half-way (PyTorch makes a
    # process group's communicator at its first call): the pieces handed out before
    # this process saw them are scanned again here, and the rest read here first.
    init = V24.splitlines()[1]
    coll = V24.splitlines()[2].replace(" [nranks=4]", "")      # its rank and size come from INIT lines
    late = [init.replace("0x55d0c7a0", f"0x66{k:06x}").replace("rank 0 nranks 4", "rank 1 nranks 8")
            for k in range(3)]
    lines = [init] + [coll] * 3000
    if where == "middle":
        lines[1500:1500] = late
        lines += [coll.replace("0x55d0c7a0", f"0x66{k:06x}") for k in range(3)] * 200
    p = tmp_path / "init.log"
    p.write_text("\n".join(lines) + "\n")
    reads, rescans = _spy_reads(monkeypatch)
    sequential, parallel, pieces = read_both([p], monkeypatch, 4000)
    assert parallel == sequential and pieces > 50
    if where == "top":
        assert reads == [0] and rescans == []
    else:
        middle = p.read_bytes().index(b"0x66000000")
        assert rescans and min(rescans) > middle - 4000       # only pieces after the new INIT lines
        assert len(rescans) <= 2 * 2 + 1                     # at most those in flight when it was replayed
        assert reads[0] == 0 and len(reads) > 10             # then read here first, piece by piece
        assert {c[4] for c in sequential[0]} == {4, 8}
