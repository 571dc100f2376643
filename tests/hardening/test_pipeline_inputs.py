"""`collc pipeline` and schedule CSVs on inputs past the limits, absurd values, and
files that are not files: a located error (exit 1) within seconds, never a hang, a
traceback or a figure of hundreds of digits."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from collc.analysis.simulate import Router
from collc.diagnostics import CollcError
from collc.pipeline.csv_format import parse_rows, read_schedule
from hardening_inputs import run_collc as _run

STAR = """
topology star(n = 8) {
    switch sw;
    gpu g[n];
    for i in 0..n { link g[i] <-> sw bw 25 GB/s lat 1 us; }
}
pipeline p(stages = 4, mb = 8, chunks = 1, sched = "1f1b") on star(stages) {
    stages = stages;
    microbatches = mb;
    chunks = chunks;
    schedule = sched;
    forward = FORWARD;
    backward = 2 ms;
    activations = ACTIVATIONS;
    DEVICE
}
"""


def _program(tmp_path: Path, forward: str = "1 ms", activations: str = "16 MiB", device: str = "") -> Path:
    path = tmp_path / "p.coll"
    path.write_text(STAR.replace("FORWARD", forward).replace("ACTIVATIONS", activations).replace("DEVICE", device))
    return path




@pytest.mark.parametrize("call, limit", [("p(4, 1000000)", "COLLC_LIMIT_MICROBATCHES"),
                                         ("p(4, 8, 100000, \"interleaved\")", "COLLC_LIMIT_MODEL_CHUNKS"),
                                         ("p(8, 60000, 8, \"interleaved\")", "COLLC_LIMIT_PIPELINE_ACTIONS")],
                         ids=["microbatches", "chunks", "actions"])
def test_pipeline_size_limits_stop_at_once(tmp_path, capsys, call, limit):
    start = time.perf_counter()
    rc, err = _run(["pipeline", f"{_program(tmp_path)}:{call}", "--no-synthesis"], capsys)
    assert rc == 1 and limit in err and "Traceback" not in err
    assert time.perf_counter() - start < 10


@pytest.mark.parametrize("setting", [dict(forward="1e300 s"), dict(activations="1e30 B"),
                                     dict(device="device_memory = 1e300 B;")])
def test_absurd_times_and_sizes_are_located_errors(tmp_path, capsys, setting):
    rc, err = _run(["pipeline", str(_program(tmp_path, **setting)), "--no-synthesis"], capsys)
    assert rc == 1 and "COLLC_LIMIT_" in err and "p.coll:" in err


def test_stage_transfers_search_only_near_the_two_gpus(tmp_path, capsys, monkeypatch):
    """The path search for S-1 stage boundaries is not S searches of the whole topology
    (that was quadratic: 1,000 stages took 10 s, 8,192 over a minute)."""
    def whole_search(self, src):
        raise AssertionError("a search of the whole topology from one GPU")

    monkeypatch.setattr(Router, "_default_paths_from", whole_search)
    start = time.perf_counter()
    rc, err = _run(["pipeline", f"{_program(tmp_path)}:p(2000, 2)", "--no-synthesis"], capsys)
    assert rc == 0, err
    assert time.perf_counter() - start < 60


def test_path_between_is_the_path_the_simulator_takes():
    from collc import frontend
    from collc.ir.schedule import Buffer, Loc, Op, OpKind

    for spec in ("dgx1", "dgx2(2)", "ndv2(2)"):
        topo = frontend.resolve_topology(spec)
        full, near = Router(topo), Router(topo)
        for a in range(0, topo.num_ranks, 3):
            for b in range(topo.num_ranks):
                if a == b:
                    continue
                try:
                    want = full.path_for(Op(0, OpKind.COPY, Loc(a, Buffer.INPUT, 0), Loc(b, Buffer.OUTPUT, 0)))
                except CollcError:
                    want = None
                assert near.path_between(a, b) == want


def test_csv_row_of_many_commas_is_parsed_in_linear_time():
    line = "0F0" + "," * 300_000 + "\n"
    start = time.perf_counter()
    rows = parse_rows(line, "s.csv").rows
    assert len(rows[0]) == 300_001
    assert time.perf_counter() - start < 5
    cells = parse_rows("(0F7;7B3)OVERLAP_F_B,1F0,,(1B2)OVERLAP_F_B\n", "s.csv").rows[0]
    assert [str(c) if c else "" for c in cells] == ["(0F7;7B3)OVERLAP_F_B", "1F0", "", "(1B2)OVERLAP_F_B"]


def test_csv_cells_limit(tmp_path, monkeypatch):
    monkeypatch.setenv("COLLC_LIMIT_CSV_CELLS", "1000")
    with pytest.raises(CollcError, match="COLLC_LIMIT_CSV_CELLS"):
        parse_rows("0F0" + ",0F0" * 2000 + "\n", "s.csv")


@pytest.mark.parametrize("text, words", [("0SEND_F0,0RECV_B0\n1UNSHARD,1RESHARD\n", "no compute actions"),
                                         ("0F" + "9" * 5000 + "\n", "digits"),
                                         ("0F99999999999\n", "COLLC_LIMIT_MICROBATCHES"),
                                         ("99999999F0\n", "COLLC_LIMIT_MODEL_CHUNKS")],
                         ids=["no-compute", "digits", "microbatch", "stage"])
def test_csv_without_compute_or_with_huge_numbers_is_a_located_error(tmp_path, text, words):
    path = tmp_path / "s.csv"
    path.write_text(text)
    with pytest.raises(CollcError, match=words) as info:
        read_schedule(path)
    assert info.value.span is not None and info.value.span.file == str(path)


def test_csv_byte_order_mark_is_accepted(tmp_path):
    path = tmp_path / "s.csv"
    path.write_bytes(b"\xef\xbb\xbf0F0,0B0\n")
    order = read_schedule(path)
    assert order.ranks == 1 and len(order.actions[0]) == 2


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs")
@pytest.mark.parametrize("kind", ["directory", "fifo"])
def test_schedule_that_is_not_a_file_says_what_it_is(tmp_path, capsys, kind):
    target = tmp_path / "s.csv"
    if kind == "directory":
        target.mkdir()
    else:
        os.mkfifo(target)
    prog = _program(tmp_path).read_text().replace('sched = "1f1b"', 'sched = "s.csv"')
    (tmp_path / "q.coll").write_text(prog)
    rc, err = _run(["pipeline", str(tmp_path / "q.coll"), "--no-synthesis"], capsys)
    word = {"directory": "a directory", "fifo": "a FIFO"}[kind]
    assert rc == 1 and word in err and "cannot find" not in err


def test_pipeline_of_a_device_says_what_it_is(capsys):
    rc, err = _run(["pipeline", "/dev/zero"], capsys)
    assert rc == 1 and "character device" in err and "unexpected" not in err
