"""`collc profile` end to end on the real samples: JSON, exit codes, located errors, no
partial output, the model on a stdlib topology, and a verified MSCCL XML library."""

import gzip
import json
import re
from pathlib import Path

import pytest

from collc.cli import main
from collc.profile.mix import COMBINE_NOTE

from trace_samples import LOGS, sample

KINETO = "hta__nccl_parser_config__nccl_data.json.gz"
ALLTOALL = "hta__trace_diff__control__control.json.gz"
NCCL_LOG = "nccl-tests__Timez-zx_all_reduce_perf_2xA100_nccl-2.27.7.log"


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main(["profile", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def test_kineto_sample_json(tmp_path, capsys):
    out = tmp_path / "mix.json"
    code, text, _ = run(capsys, sample(KINETO), "--json", out)
    assert code == 0
    data = json.loads(out.read_text())
    assert data["world_size"] == 2
    assert data["sources"] == [{"path": str(sample(KINETO)), "format": "kineto", "records": 21, "skipped": {}}]
    assert data["iterations"] == {"count": 3, "calls_per_iteration": 7, "warmup_calls": 0,
                                  "method": "repeating call sequence"}
    rows = {(r["collective"], r["dtype"], r["bytes"]): r for r in data["collectives"]}
    assert set(rows) == {("allreduce", "float32", b) for b in (8196000, 9724160, 26255360, 26550272, 31502336)} | {
        ("broadcast", "float32", 212480), ("broadcast", "int64", 424)}
    for r in data["collectives"]:
        assert (r["calls"], r["job_calls"], r["ranks_seen"], r["nranks"], r["communicator"]) == (3, 3, 1, 2, "0")
        # On 2 ranks both factors are 1: AllReduce's 2(n-1)/n, and Broadcast's 1.
        assert r["time_us"] > 0 and r["busbw_GBps"] == pytest.approx(r["algbw_GBps"])
    # Biggest first, by measured time.
    times = [r["time_us"] for r in data["collectives"]]
    assert times == sorted(times, reverse=True)
    big = rows[("allreduce", "float32", 31502336)]
    assert big["algbw_GBps"] == pytest.approx(31502336 * 3 / (big["time_us"] * 1e-6) / 1e9)
    assert data["communicators"][0]["role"] == "data-parallel"
    assert data["ranks_combined"] == COMBINE_NOTE
    # The terminal: summary, then the table.
    assert "world size 2" in text and "iterations: 3 of 7 calls" in text
    assert "ranks combined:" in text and "Collective mix, biggest time first" in text


def test_the_command_keeps_freed_memory_for_reuse(tmp_path, capsys, allocator_calls):
    # Asked once, before any reading (tests/test_memory.py checks what the call does).
    code, _, _ = run(capsys, sample(KINETO), "--json", tmp_path / "mix.json")
    assert code == 0 and allocator_calls == ["reuse_freed_memory"]


def test_nccl_log_sample_untimed(tmp_path, capsys):
    out = tmp_path / "mix.json"
    code, text, _ = run(capsys, sample(NCCL_LOG, LOGS), "--json", out, "--nccl-tests")
    assert code == 0
    data = json.loads(out.read_text())
    assert data["weighted_by"] == "bytes" and data["world_size"] == 2
    # 990 COLL lines of 2 ranks: 11 sizes from 8 MiB to 8 GiB, 45 calls each, both ranks seen.
    sizes = sorted(r["bytes"] for r in data["collectives"])
    assert sizes == [2 ** k for k in range(23, 34)]
    assert all((r["calls"], r["job_calls"], r["ranks_seen"], r["time_us"]) == (90, 45, 2, None)
               for r in data["collectives"])
    (cmd,) = data["nccl_tests"][:1]
    assert cmd["command"].startswith("./build/all_reduce_perf -b ") and "-d float -o sum -g 2" in cmd["command"]
    assert sum(c["job_calls"] for c in data["nccl_tests"]) == 45 * 11
    for c in data["nccl_tests"]:  # -b/-e are sizes the job used, bands within a factor of 4
        lo, hi = map(int, re.search(r"-b (\d+) -e (\d+)", c["command"]).groups())
        assert lo in sizes and hi in sizes and hi <= 4 * lo
    assert "all_reduce_perf" in text


def test_library_on_stdlib_topology_verified_and_saving_positive(tmp_path, capsys):
    lib, out, plots = tmp_path / "lib", tmp_path / "p.json", tmp_path / "plots"
    code, text, _ = run(capsys, sample(ALLTOALL), "--topology", "dgx1", "--library", lib, "--time-limit", "1",
                        "--json", out, "--plot", plots)
    assert code == 0
    data = json.loads(out.read_text())
    model = data["model"]
    per = model["per_iteration_us"]
    assert per["bound"] <= per["collc"] <= per["baseline"]
    assert model["saving_per_iteration_us"] >= 0
    files = data["library"]["files"]
    assert files and data["library"]["saving_per_iteration_us"] > 0
    assert all(f["saving_per_iteration_us"] > 0 for f in files)
    # Bands of one library never overlap.
    ranges = sorted((f["min_bytes"], f["max_bytes"]) for f in files)
    assert all(a[1] < b[0] for a, b in zip(ranges, ranges[1:]))
    assert sorted(p.name for p in lib.iterdir()) == sorted(Path(f["path"]).name for f in files)
    capsys.readouterr()
    assert main(["verify", *[f["path"] for f in files]]) == 0
    # AlltoAll has no stdlib baseline: said, not silently dropped.
    assert any("alltoall" in n and "not modeled" in n for n in model["notes"])
    assert model["hottest_links"]["baseline"][0]["utilization"] > 0
    assert {p.name for p in plots.iterdir()} == {f"{s}.{e}" for s in ("sizes", "share", "links")
                                                 for e in ("png", "svg")}
    assert "all verified" in text


def test_no_library_file_where_nccl_is_as_fast(tmp_path, capsys):
    # Two ranks on one switch: the ring is already optimal, so no band earns a file.
    lib, out = tmp_path / "lib", tmp_path / "p.json"
    code, text, _ = run(capsys, sample(KINETO), "--topology", "switch(n=2)", "--library", lib,
                        "--time-limit", "1", "--json", out)
    assert code == 0
    data = json.loads(out.read_text())
    assert data["library"]["files"] == [] and data["library"]["saving_per_iteration_us"] == 0
    assert not lib.exists()
    assert data["model"]["saving_per_iteration_us"] >= 0
    assert "no file written" in text


def test_rank_map_beyond_topology_is_an_error(tmp_path, capsys):
    code, _, err = run(capsys, sample(KINETO), "--topology", "switch(n=2)", "--rank-map", "0,5")
    assert code == 1 and "needs GPU 5" in err and "Traceback" not in err


def test_usage_errors_exit_2(capsys):
    code, _, err = run(capsys, sample(KINETO), "--library", "x")
    assert code == 2 and "--library needs --topology" in err


def test_json_into_a_file_path_fails_before_writing(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    code, _, err = run(capsys, sample(KINETO), "--json", blocker / "out.json", "--plot", tmp_path / "plots")
    assert code == 1 and "is a file" in err
    assert not (tmp_path / "plots").exists()


def test_malformed_trace_located_error_no_output(tmp_path, capsys):
    raw = gzip.decompress(sample(KINETO).read_bytes())
    bad = tmp_path / "truncated.json"
    bad.write_bytes(raw[: len(raw) // 2])
    out = tmp_path / "out.json"
    code, _, err = run(capsys, bad, "--json", out, "--plot", tmp_path / "plots")
    assert code == 1
    assert re.search(rf"{re.escape(str(bad))}:\d+:\d+: error:", err), err
    assert not out.exists() and not (tmp_path / "plots").exists()
    assert list(tmp_path.iterdir()) == [bad]


def test_missing_trace(tmp_path, capsys):
    code, _, err = run(capsys, tmp_path / "nope.json")
    assert code == 1 and "no such file" in err


def test_directory_of_two_ranks_is_combined(tmp_path, capsys):
    # Ranks 0 and 1 of a 128-rank job: calls both ranks made at the same size and in the
    # same order become one job call seen by 2 ranks; the rest stay single-rank.
    ranks = tmp_path / "ranks"
    ranks.mkdir()
    for r in (0, 1):
        src = sample(f"hta__trace_filter__sampled_rank-{r}.json.gz")
        (ranks / src.name).write_bytes(src.read_bytes())
    out = tmp_path / "mix.json"
    code, text, _ = run(capsys, ranks, "--json", out)
    assert code == 0
    data = json.loads(out.read_text())
    assert data["world_size"] == 128 and len(data["sources"]) == 2
    rows = data["collectives"]
    assert sum(r["calls"] for r in rows) == 20
    both = [r for r in rows if r["ranks_seen"] == 2]
    assert both and sum(r["job_calls"] for r in rows) < 20
    for r in both:  # latency is the shorter rank's; the spread is reported as straggler time
        assert r["time_us"] is not None and r["straggler_us"] >= 0
    assert all(r["named_by"] == {"launch-op": r["calls"]} for r in rows)
    assert "launched the kernel" in text


def test_bad_topology_and_rank_map(capsys):
    code, _, err = run(capsys, sample(KINETO), "--topology", "nosuch(3)")
    assert code == 1 and "<--topology>:1:1: error: unknown topology 'nosuch'" in err
    code, _, err = run(capsys, sample(KINETO), "--topology", "dgx1", "--rank-map", "0,x")
    assert code == 2 and "--rank-map takes comma-separated GPU numbers" in err


def test_log_without_coll_lines_says_what_to_set_and_what_it_knows(tmp_path, capsys):
    """`NCCL_DEBUG=INFO` without the COLL subsystem: INIT and TUNING lines only (the real
    2.27.7 log without its COLL lines). Exit 1, no output written, and the log's version,
    communicator and TUNING output printed before the error and its remedy."""
    real = sample(NCCL_LOG, LOGS).read_text()
    log = tmp_path / "init-only.log"
    log.write_text("".join(line for line in real.splitlines(keepends=True) if "opCount" not in line))
    out = tmp_path / "mix.json"
    code, text, err = run(capsys, log, "--json", out)
    assert code == 1 and not out.exists()
    assert "NCCL version: 2.27.7+cuda13.0" in text
    assert "communicator 0x54fe282d32a87d85: 2 ranks (ranks 0,1 seen in this log), 1 node(s): mew0" in text
    assert "AllReduce 8388608 B -> RING/SIMPLE" in text
    assert "TUNING table" in text and "AllReduce |" in text
    assert "no collective calls" in err and "NCCL_DEBUG_SUBSYS=INIT,COLL,TUNING" in err


def test_kernels_named_by_their_name_are_marked(tmp_path, capsys):
    code, text, _ = run(capsys, sample("hta__negative_queue_length_values_check__rank0.json.gz"),
                        "--rows", "40", "--json", tmp_path / "m.json")
    assert code == 0
    assert "sendrecv+" in text and "+ named by the NCCL kernel's name alone" in text
    rows = json.loads((tmp_path / "m.json").read_text())["collectives"]
    assert sum(r["calls"] for r in rows) == 80
    assert [r["named_by"] for r in rows if r["collective"] == "sendrecv"] == [{"kernel-name": 5}]


def test_workers_must_be_positive(capsys):
    code, _, err = run(capsys, sample(KINETO), "--workers", "0")
    assert code == 2 and "--workers must be at least 1" in err


def test_a_logs_profile_loads_no_masked_arrays(tmp_path):
    # np.unique without its optional outputs imports numpy.ma (10 ms of a small log's
    # command) to check for a masked array; the mix numbers values without it.
    import subprocess
    import sys
    code = ("import sys; from collc.cli import main; main(['profile', sys.argv[1], '--json', sys.argv[2]]); "
            "print('numpy.ma' in sys.modules, 'numpy' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code, str(sample(NCCL_LOG, LOGS)), str(tmp_path / "out.json")],
                          capture_output=True, text=True, check=True)
    assert done.stdout.split()[-2:] == ["False", "True"]
