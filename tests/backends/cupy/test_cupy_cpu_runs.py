"""Generated executors run on CPU (NumPy) as `python FILE.py --device cpu --check`."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest

from cupy_executor_helpers import collective_schedules as cs
from cupy_executor_helpers import load_executor, run_executor, table_rows, write_executor

# (collective, ranks, chunks, dtype): every builder, several shapes and types.
CASES = [
    ("allgather", 4, 1, "float32"),
    ("allgather", 3, 2, "int8"),
    ("reducescatter", 4, 2, "float16"),
    ("reducescatter", 5, 1, "int32"),
    ("allreduce", 4, 1, "float64"),
    ("allreduce", 3, 2, "uint8"),
    ("alltoall", 4, 2, "int64"),
    ("alltoall", 3, 1, "float32"),
    ("broadcast", 5, 3, "float16"),
    ("broadcast", 4, 1, "uint32"),
]
FACTORS = {"allgather": lambda n: (n - 1) / n, "reducescatter": lambda n: (n - 1) / n,
           "alltoall": lambda n: (n - 1) / n, "allreduce": lambda n: 2 * (n - 1) / n, "broadcast": lambda n: 1.0}


@pytest.mark.parametrize("kind,ranks,chunks,dtype", CASES)
def test_checked_runs_have_no_wrong_values(tmp_path: Path, kind: str, ranks: int, chunks: int, dtype: str):
    schedule = cs.BUILDERS[kind](ranks, chunks)
    path = write_executor(schedule, tmp_path / f"{kind}.py")
    done = run_executor(path, "--device", "cpu", "--check", "-b", "1K", "-e", "64K", "-f", "8", "--dtype", dtype,
                        "-n", "2", "-w", "1")
    assert done.returncode == 0, done.stdout + done.stderr
    rows = table_rows(done.stdout)
    assert len(rows) == 3  # 1K, 8K, 64K
    itemsize = int(re.sub(r"\D", "", dtype)) // 8
    max_slots = max(schedule.collective.in_chunks, schedule.collective.out_chunks)
    for row, size in zip(rows, (1 << 10, 1 << 13, 1 << 16)):
        elems = size // (itemsize * max_slots)
        assert int(row[0]) == elems * max_slots * itemsize  # rounded down to whole elements per slot
        assert int(row[1]) == elems * max_slots
        assert row[2] == dtype
        assert row[8] == "0"
        algbw, busbw = float(row[6]), float(row[7])
        assert busbw == pytest.approx(algbw * FACTORS[kind](ranks), abs=0.011)
    assert "# Out of bounds values : 0 OK" in done.stdout


def _corrupt(source: str, op_id: int, field: int, value: int) -> str:
    """Change one field of one op row of the embedded STEPS."""
    pattern = re.compile(rf"^(\s+)\(({op_id}, [^)]*)\),$", re.MULTILINE)
    match = pattern.search(source)
    assert match, f"op {op_id} not found"
    fields = match.group(2).split(", ")
    fields[field] = str(value)
    return source[:match.start()] + f"{match.group(1)}({', '.join(fields)})," + source[match.end():]


def test_a_misrouted_copy_fails_the_check(tmp_path: Path):
    schedule = cs.ring_allgather(4)
    path = write_executor(schedule, tmp_path / "ag.py")
    victim = next(op for op in schedule.ops if op.step == 2)
    # deliver the block to the wrong output slot: one slot stays unwritten, one is wrong
    path.write_text(_corrupt(path.read_text(), victim.id, 7, (victim.dst.index + 1) % 4))
    done = run_executor(path, "--device", "cpu", "--check", "--size", "4K", "-n", "1", "-w", "0")
    assert done.returncode == 1
    (row,) = table_rows(done.stdout)
    # at least the slot it should have filled is wrong (256 float32 elements), and at
    # most the blocks that travel on from there
    assert 256 <= int(row[8]) < 4 * 4 * 256
    assert "FAILED" in done.stdout


def test_a_reduction_turned_into_a_copy_fails_the_check(tmp_path: Path):
    schedule = cs.ring_allreduce(3)
    path = write_executor(schedule, tmp_path / "ar.py")
    victim = next(op for op in schedule.ops if op.kind.value == "reduce")
    path.write_text(_corrupt(path.read_text(), victim.id, 1, 0))
    done = run_executor(path, "--device", "cpu", "--check", "--size", "3K", "-n", "1", "-w", "0")
    assert done.returncode == 1
    assert int(table_rows(done.stdout)[0][8]) > 0
    # without --check the same run reports nothing wrong (it cannot know)
    unchecked = run_executor(path, "--device", "cpu", "--size", "3K", "-n", "1", "-w", "0")
    assert unchecked.returncode == 0 and table_rows(unchecked.stdout)[0][8] == "N/A"


def test_an_edit_that_leaves_the_buffers_is_a_usage_error(tmp_path: Path):
    schedule = cs.ring_allgather(3)
    path = write_executor(schedule, tmp_path / "ag.py")
    path.write_text(_corrupt(path.read_text(), schedule.ops[-1].id, 7, 3))
    done = run_executor(path, "--device", "cpu", "--size", "1K")
    assert done.returncode == 2
    assert "inconsistent" in done.stderr and "output[3..4]" in done.stderr


@pytest.mark.parametrize("kind", ["allgather", "reducescatter", "allreduce", "broadcast"])
def test_in_place_runs(tmp_path: Path, kind: str):
    path = write_executor(cs.BUILDERS[kind](4, 2), tmp_path / f"{kind}.py")
    done = run_executor(path, "--device", "cpu", "--check", "--inplace", "-b", "1K", "-e", "8K", "-f", "8",
                        "-n", "2", "-w", "1")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "in-place" in done.stdout
    assert [row[8] for row in table_rows(done.stdout)] == ["0", "0"]


def test_in_place_runs_alias_the_buffers(tmp_path: Path):
    # Direct AllToAll overwrites input blocks other ranks still have to send once input
    # and output share memory: in place, the check must catch it.
    path = write_executor(cs.direct_alltoall(4), tmp_path / "a2a.py")
    assert run_executor(path, "--device", "cpu", "--check", "--size", "4K", "-n", "1").returncode == 0
    done = run_executor(path, "--device", "cpu", "--check", "--inplace", "--size", "4K", "-n", "1")
    assert done.returncode == 1 and int(table_rows(done.stdout)[0][8]) > 0


def test_in_place_needs_matching_buffers(tmp_path: Path):
    module = load_executor(write_executor(cs.ring_allgather(3, chunks=2), tmp_path / "ag.py"))
    assert module.rank_layout(2, True).offsets == (4, 0, 6)  # input = rank 2's block of the output
    module.OUT_SLOTS = (5, 5, 5)
    with pytest.raises(module.UsageError, match="--inplace"):
        module.rank_layout(0, True)


@pytest.mark.parametrize("args,message", [
    (["--dtype", "complex64"], "unknown data type"),
    (["--size", "12Q"], "cannot read size"),
    (["-b", "64K", "-e", "1K"], "below the smallest"),
    (["-b", "1K", "-e", "64K", "-f", "1"], "step factor"),
    (["--iters", "0"], "--iters"),
    (["--mode", "multi"], "launcher"),
])
def test_usage_errors_exit_2(ag2, capsys, args: list[str], message: str):
    assert ag2.main(["--device", "cpu", *args], {}, io.StringIO()) == 2
    assert message in capsys.readouterr().err


@pytest.fixture(scope="module")
def ag2(tmp_path_factory):
    return load_executor(write_executor(cs.ring_allgather(2), tmp_path_factory.mktemp("ag2") / "ag.py"))


def test_size_parsing_and_sweeps(ag2):
    m = ag2
    assert [m.parse_size(t) for t in ("4096", "1K", "1k", "64M", "2G", "1KiB", "1KB", "1.5M", "8B")] == [
        4096, 1024, 1024, 64 << 20, 2 << 30, 1024, 1000, 3 << 19, 8]
    assert m.size_sweep(1024, 8192) == [1024, 2048, 4096, 8192]
    assert m.size_sweep(1024, 5000, 4) == [1024, 4096]
    assert m.size_sweep(100, 400, increment=100) == [100, 200, 300, 400]
    assert m.size_sweep(7, 7, factor=1) == [7]
    assert m.slot_elements(1000, 4) == 1000 // 8 and m.slot_elements(1, 8) == 1


def test_bfloat16_where_supported(tmp_path: Path):
    path = write_executor(cs.ring_allreduce(3), tmp_path / "ar.py")
    done = run_executor(path, "--device", "cpu", "--check", "--size", "3K", "--dtype", "bf16", "-n", "1")
    try:
        import ml_dtypes  # noqa: F401
    except ImportError:
        assert done.returncode == 2 and "ml_dtypes" in done.stderr
    else:
        assert done.returncode == 0 and table_rows(done.stdout)[0][2] == "bfloat16"


def test_gpu_without_a_gpu_is_a_usage_error(tmp_path: Path):
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() > 0:
            pytest.skip("there is a GPU here")
    except Exception:  # no CuPy, no driver, no device: what this test is about
        pass
    path = write_executor(cs.ring_allgather(2), tmp_path / "ag.py")
    done = run_executor(path, "--device", "gpu", "--size", "1K")
    assert done.returncode == 2 and "CuPy" in done.stderr
    auto = run_executor(path, "--size", "1K", "-n", "1")  # --device auto falls back to NumPy
    assert auto.returncode == 0 and "cpu (NumPy" in auto.stdout
