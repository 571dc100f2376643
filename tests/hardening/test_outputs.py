"""Outputs: checked before solving, never written through or over anything but a
regular file, and all or nothing."""

from __future__ import annotations

import os
import stat

import pytest

from collc import io as collc_io
from collc.diagnostics import CollcError

from hardening_inputs import RING4, listing, write

ONE = RING4 + "compile allgather on t() size 1 MiB using ring;\n"
TWO = RING4 + "compile allgather on t() size 1 MiB using ring;\ncompile allgather on t() size 2 MiB using ring;\n"


@pytest.fixture
def no_solve(monkeypatch):
    """Fail the test if any schedule is produced: the checks must come first."""
    import collc.driver

    def boom(*args, **kwargs):
        raise AssertionError("a schedule was produced before the outputs were checked")

    monkeypatch.setattr(collc.driver, "schedule_for_backend", boom)


def test_output_onto_a_device_file_is_refused(collc, tmp_path, no_solve):
    write(tmp_path / "p.coll", ONE)
    run = collc("compile", "p.coll", "-o", "/dev/null", "-q")
    assert run.status == 1 and "character device" in run.err
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_output_onto_a_fifo_is_refused(collc, tmp_path, no_solve):
    write(tmp_path / "p.coll", ONE)
    os.mkfifo(tmp_path / "fifo")
    run = collc("compile", "p.coll", "-o", "fifo", "-q")
    assert run.status == 1 and "FIFO" in run.err
    assert stat.S_ISFIFO(os.lstat(tmp_path / "fifo").st_mode)


def test_output_onto_a_symlink_is_refused_and_its_target_kept(collc, tmp_path, no_solve):
    write(tmp_path / "p.coll", ONE)
    write(tmp_path / "target", "precious\n")
    os.symlink(tmp_path / "target", tmp_path / "link")
    run = collc("compile", "p.coll", "-o", "link", "-q")
    assert run.status == 1 and "symbolic link" in run.err
    assert os.path.islink(tmp_path / "link") and (tmp_path / "target").read_text() == "precious\n"


def test_atomic_write_never_renames_over_a_non_regular_file(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(CollcError, match="FIFO"):
        collc_io.atomic_write(tmp_path / "fifo", "x")
    assert stat.S_ISFIFO(os.lstat(tmp_path / "fifo").st_mode)
    assert listing(tmp_path) == ["fifo"]


def test_report_equal_to_output_is_a_usage_error(collc, tmp_path, no_solve):
    write(tmp_path / "p.coll", ONE)
    run = collc("compile", "p.coll", "-o", "a.json", "--report", "./a.json", "-q")
    assert run.status == 2 and "same file" in run.err


@pytest.mark.parametrize("target, words", [
    ("/proc/collc-out.json", "cannot write"),
    ("plain/x.json", "is a file, not a directory"),
    ("a" * 300 + ".json", "longer than the file system allows"),
    ("d/" + "b" * 300 + "/x.json", "longer than the file system allows"),
])
def test_unwritable_output_fails_before_solving(collc, tmp_path, no_solve, target, words):
    write(tmp_path / "p.coll", ONE)
    write(tmp_path / "plain", "")
    run = collc("compile", "p.coll", "-o", target, "-q")
    assert run.status == 1 and words in run.err, run.err
    assert listing(tmp_path) == ["p.coll", "plain"]


def test_read_only_directory_fails_before_solving(collc, tmp_path, no_solve):
    if os.geteuid() == 0:
        pytest.skip("root writes into read-only directories")
    write(tmp_path / "p.coll", ONE)
    (tmp_path / "ro").mkdir()
    os.chmod(tmp_path / "ro", 0o555)
    run = collc("compile", "p.coll", "-o", "ro/x.json", "-q")
    assert run.status == 1 and "cannot write" in run.err


def test_failing_report_path_leaves_no_output(collc, tmp_path, no_solve):
    write(tmp_path / "p.coll", ONE)
    os.mkfifo(tmp_path / "r.json")
    run = collc("compile", "p.coll", "-o", "o.json", "--report", "r.json", "-q")
    assert run.status == 1 and "FIFO" in run.err
    assert not (tmp_path / "o.json").exists()


def test_failure_in_the_second_request_leaves_none_of_the_first(collc, tmp_path, monkeypatch):
    # The backend fails while writing the second request's schedule, after the first's
    # file was made: neither it, nor the report, nor the directory may remain.
    from dataclasses import replace

    import collc.backends.json_backend as json_backend

    real = json_backend.BACKEND
    calls = []

    def emit(unit, output, options):
        calls.append(output)
        if len(calls) == 2:
            raise CollcError("the disk filled up while writing")
        return real.emit(unit, output, options)

    monkeypatch.setattr(json_backend, "BACKEND", replace(real, emit=emit))
    write(tmp_path / "p.coll", TWO)
    run = collc("compile", "p.coll", "-o", "out/", "--report", "r.json", "-q")
    assert run.status == 1 and "disk filled up" in run.err
    assert len(calls) == 2
    assert listing(tmp_path) == ["p.coll"]


def test_all_or_nothing_removes_staged_files_and_made_directories(tmp_path):
    with pytest.raises(RuntimeError):
        with collc_io.all_or_nothing():
            collc_io.atomic_write(tmp_path / "new" / "deep" / "a.json", "1")
            collc_io.atomic_write(tmp_path / "b.json", "2")
            raise RuntimeError("the second request failed")
    assert listing(tmp_path) == []
    with collc_io.all_or_nothing():
        collc_io.atomic_write(tmp_path / "b.json", "2")
        assert not (tmp_path / "b.json").exists()  # staged until the block ends
    assert (tmp_path / "b.json").read_text() == "2"


def test_two_outputs_to_one_path_is_an_error(tmp_path):
    with pytest.raises(CollcError, match="both be written"):
        with collc_io.all_or_nothing():
            collc_io.atomic_write(tmp_path / "a.json", "1")
            collc_io.atomic_write(tmp_path / "./a.json", "2")
    assert listing(tmp_path) == []


def test_trailing_slash_means_a_directory_for_one_request(collc, tmp_path):
    write(tmp_path / "p.coll", ONE)
    run = collc("compile", "p.coll", "-o", "out/", "-q")
    assert run.status == 0, run.err
    assert (tmp_path / "out").is_dir()
    assert [p.suffix for p in (tmp_path / "out").iterdir()] == [".json"]


def test_several_requests_into_a_file_name_is_a_usage_error(collc, tmp_path, no_solve):
    write(tmp_path / "p.coll", TWO)
    run = collc("compile", "p.coll", "-o", "o.json", "-q")
    assert run.status == 2 and "trailing slash" in run.err
    assert listing(tmp_path) == ["p.coll"]


def test_empty_output_path_is_a_usage_error(collc, tmp_path):
    write(tmp_path / "p.coll", ONE)
    assert collc("compile", "p.coll", "-o", "", "-q").status == 2
    assert listing(tmp_path) == ["p.coll"]


def test_quickstart_outputs_are_ignored_by_git():
    from pathlib import Path

    ignored = (Path(__file__).resolve().parents[2] / ".gitignore").read_text().split()
    assert "/out.json" in ignored and "/report.json" in ignored


def test_read_only_file_system_is_named_before_solving(collc, tmp_path, no_solve, monkeypatch):
    import errno

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    write(tmp_path / "p.coll", ONE)
    monkeypatch.setattr(collc_io.tempfile, "mkstemp", read_only)
    run = collc("compile", "p.coll", "-o", "o.json", "-q")
    assert run.status == 1 and "read-only" in run.err


def test_cupy_executor_is_executable_after_a_staged_write(collc, tmp_path):
    write(tmp_path / "p.coll", ONE)
    run = collc("compile", "p.coll", "--backend", "cupy", "-o", "out/", "-q", "--no-baselines")
    assert run.status == 0, run.err
    (executor,) = (tmp_path / "out").iterdir()
    assert executor.suffix == ".py" and os.stat(executor).st_mode & 0o777 == 0o755


def _pieces(*parts: bytes, fail: Exception | None = None):
    yield from parts
    if fail is not None:
        raise fail


def test_a_write_in_a_child_gives_the_bytes_and_mode_of_a_plain_write(tmp_path):
    with collc_io.all_or_nothing():
        collc_io.atomic_write(tmp_path / "plain.json", _pieces(b"[1,", b" 2]\n"))
        with collc_io.written_in_child(only_with_a_core_to_spare=False):
            collc_io.atomic_write(tmp_path / "child.json", _pieces(b"[1,", b" 2]\n"))
        assert not (tmp_path / "child.json").exists()  # staged until the block ends
    assert (tmp_path / "child.json").read_bytes() == (tmp_path / "plain.json").read_bytes() == b"[1, 2]\n"
    assert os.stat(tmp_path / "child.json").st_mode == os.stat(tmp_path / "plain.json").st_mode


def test_a_child_that_cannot_write_fails_the_block_and_leaves_nothing(tmp_path):
    with pytest.raises(CollcError, match="cannot write .*child.json: the disk filled up"):
        with collc_io.all_or_nothing():
            collc_io.atomic_write(tmp_path / "plain.json", "1")
            with collc_io.written_in_child(only_with_a_core_to_spare=False):
                collc_io.atomic_write(tmp_path / "child.json", _pieces(b"[", fail=OSError(28, "the disk filled up")))
    assert listing(tmp_path) == []


def test_an_error_while_a_child_writes_stops_it_and_leaves_nothing(tmp_path):
    with pytest.raises(RuntimeError, match="verification failed"):
        with collc_io.all_or_nothing():
            with collc_io.written_in_child(only_with_a_core_to_spare=False):
                collc_io.atomic_write(tmp_path / "new" / "child.json", _pieces(*[b"x" * 4096] * 64))
            raise RuntimeError("verification failed")
    assert listing(tmp_path) == []


@pytest.mark.parametrize("spare", [True, False])
def test_a_schedule_that_fails_verification_while_written_leaves_no_file(collc, tmp_path, monkeypatch, spare):
    # `collc compile` of one request writes its file (in a child process where a core
    # is free) while it verifies the schedule: a schedule that fails leaves neither it
    # nor the report.
    from collc import driver

    monkeypatch.setattr(collc_io, "core_to_spare", lambda: spare)
    from collc.diagnostics import ScheduleError

    checked = []

    def failing_verify(schedule, topology):
        checked.append(len(schedule.ops))
        raise ScheduleError("op 7 reads a chunk its source does not hold")

    monkeypatch.setattr(driver, "verify", failing_verify)
    run = collc("compile", "--topology", "ring(n=4)", "--collective", "allgather", "--size", "64KiB", "-o", "out.json",
                "--report", "r.json", "-q")
    assert run.status == 1 and "does not hold" in run.err
    assert checked and checked[0] > 0  # verified once, by the driver (the pass left it)
    assert listing(tmp_path) == []


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="CPU affinity is Linux's")
def test_a_core_to_spare_needs_two_cpus_and_a_load_below_them(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(os, "getloadavg", lambda: (0.9, 0.0, 0.0))
    assert collc_io.core_to_spare()
    monkeypatch.setattr(os, "getloadavg", lambda: (1.5, 0.0, 0.0))
    assert not collc_io.core_to_spare()
    # The CPUs this process may use count, not the machine's: one CPU of 64 (a
    # container's share, `taskset -c 3`) has no core to spare.
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3})
    monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    assert not collc_io.core_to_spare()
